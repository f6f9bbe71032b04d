"""Sampling defaults: the checkpoint's generation_config.json field by field, else llama-server's
table; the same in `coli serve` (OpenAI and Anthropic), `coli chat` and `coli info`, shown in
/v1/models, and always overridden by what a request sets."""
import json
import shutil

import pytest

from launcher_helpers import coli
from server_helpers import CHATML, ServerProc, model, post_json, template  # noqa: F401

from colibri import sampling

MID = "qwen3_moe"
HI = [{"role": "user", "content": "Hello there"}]
LOCAL = {"temp": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0}


def with_gen_config(model, out, gc):  # noqa: F811
    shutil.copytree(model, out)
    (out / "generation_config.json").write_text(json.dumps(gc))
    return out


def test_no_generation_config_gives_llama_servers_table(tmp_path):
    values, sources = sampling.model_defaults(tmp_path)
    assert values == LOCAL and set(sources.values()) == {sampling.LOCAL_SOURCE}


def test_the_checkpoints_fields_win_one_by_one(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.1, "eos_token_id": 2}))
    values, sources = sampling.model_defaults(tmp_path)
    assert values == {"temp": 0.6, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "repeat_penalty": 1.1}
    assert sources["temp"] == sources["top_p"] == "generation_config.json"
    assert sources["top_k"] == sources["min_p"] == sampling.LOCAL_SOURCE
    line = sampling.describe(values, sources)
    assert line.startswith("temperature 0.6, top_k 40, top_p 0.9, min_p 0.05, repetition_penalty 1.1 (")
    assert "temperature, top_p, repetition_penalty from generation_config.json" in line


def test_unusable_values_are_ignored(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": "hot", "top_p": 0, "top_k": 2.5, "min_p": True, "repetition_penalty": 0}))
    assert sampling.model_defaults(tmp_path)[0] == LOCAL
    (tmp_path / "generation_config.json").write_text("[1, 2]")
    assert sampling.model_defaults(tmp_path)[0] == LOCAL


def test_info_shows_the_defaults(model, tmp_path):  # noqa: F811
    d = with_gen_config(model, tmp_path / "m", {"temperature": 0.3, "top_k": 20})
    r = coli("info", "--model", d)
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("sampling"))
    assert "temperature 0.3, top_k 20, top_p 0.95, min_p 0.05" in line and "coli run decodes greedily" in line


@pytest.fixture(scope="module")
def greedy_model(model, tmp_path_factory):  # noqa: F811
    """A model whose checkpoint asks for temperature 0 and a strong repetition penalty: unset
    requests then decode greedily with it."""
    d = with_gen_config(model, tmp_path_factory.mktemp("gc") / MID,
                        {"temperature": 0.0, "top_k": 7, "repetition_penalty": 3.0})
    (d / "chat_template.jinja").write_text(CHATML)  # coli chat reads the model's own
    return d


@pytest.fixture(scope="module")
def server(greedy_model, template):  # noqa: F811
    with ServerProc(greedy_model, "--chat-template", template, "--kv-slots", "2", "--no-kv-persist") as s:
        yield s


def chat(server, **kw):
    s, _, b = post_json(server.port, "/v1/chat/completions", {"messages": HI, "max_tokens": 16, **kw})
    assert s == 200, b
    return b["choices"][0]["message"]["content"]


def test_models_entry_shows_the_defaults(server):
    s, _, b = server.request("GET", "/v1/models")
    d = json.loads(b)["data"][0]["sampling_defaults"]
    gc = "generation_config.json"
    assert d == {"temperature": 0.0, "top_k": 7, "top_p": 0.95, "min_p": 0.05, "repetition_penalty": 3.0,
                 "source": {"temperature": gc, "top_k": gc, "top_p": sampling.LOCAL_SOURCE,
                            "min_p": sampling.LOCAL_SOURCE, "repetition_penalty": gc}}


def test_unset_fields_take_the_models_defaults_and_request_fields_win(server):
    greedy = chat(server, temperature=0)
    assert chat(server) == greedy and chat(server, seed=5) == greedy  # the checkpoint's temperature 0
    sampled = {chat(server, temperature=1.5, top_k=0, top_p=1, seed=s) for s in (1, 2, 3)}
    assert sampled - {greedy}  # the request's temperature overrides the default
    s, _, b = post_json(server.port, "/v1/messages", {"messages": HI, "max_tokens": 16})
    assert s == 200 and b["content"][0]["text"] == greedy  # Anthropic too


def test_chat_samples_with_the_models_defaults(greedy_model):
    r = coli("chat", "--model", greedy_model, "--max-tokens", "4", input="Hi\n")
    assert r.returncode == 0, r.stderr
    assert "sampling: temperature 0, top_k 7, top_p 0.95, min_p 0.05, repetition_penalty 3 (" in r.stdout
    r = coli("chat", "--model", greedy_model, "--max-tokens", "4", "--temp", "0.5", input="Hi\n")
    assert "sampling: temperature 0.5, top_k 7" in r.stdout and "temperature from flag" in r.stdout


def test_penalties_come_from_the_checkpoint_and_the_request(server):
    default = chat(server)
    assert chat(server, temperature=0, repetition_penalty=3.0) == default
    assert chat(server, temperature=0, repeat_penalty=3.0) == default  # llama-server's name
    plain = chat(server, temperature=0, repetition_penalty=1)
    assert plain != default  # the checkpoint's penalty is applied unless the request says otherwise
    assert chat(server, temperature=0, repetition_penalty=1, presence_penalty=2, repeat_last_n=-1) != plain
    assert chat(server, temperature=0, repetition_penalty=1, frequency_penalty=0, presence_penalty=0) == plain


@pytest.mark.parametrize("field,value", [("presence_penalty", 2.5), ("frequency_penalty", -3),
                                         ("repetition_penalty", 0), ("repeat_last_n", -2)])
def test_penalties_out_of_range_are_named_400s(server, field, value):
    s, _, b = post_json(server.port, "/v1/chat/completions", {"messages": HI, "max_tokens": 2, field: value})
    assert s == 400 and b["error"]["param"] == field, b


def test_two_names_for_one_penalty_must_agree(server):
    s, _, b = post_json(server.port, "/v1/chat/completions",
                        {"messages": HI, "max_tokens": 2, "repetition_penalty": 1.2, "repeat_penalty": 1.3})
    assert s == 400 and "send one of them" in b["error"]["message"]
