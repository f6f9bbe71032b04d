"""`coli serve --kv-slots 4 --parallel 4`: four requests run in the engine at once (continuous
batching) and each gets the tokens it gets alone; the admission queue and its 429s count the
running requests as before. The engine is paused (SIGSTOP) while requests arrive, so that all
four are in it together is proven, not hoped for."""
import collections
import threading

import openai
import pytest

from server_helpers import ServerProc, convert, resume_engine, stop_engine

PROMPTS = ["The quick brown fox", "Once upon a time", "In a galaxy far", "Hello"]


@pytest.fixture(scope="module", params=["llama", "qwen3_moe"])
def served(request, oracle_root, tmp_path_factory):
    model = convert(oracle_root, request.param, tmp_path_factory.mktemp("par") / request.param)
    with ServerProc(model, "--kv-slots", "4", "--parallel", "4", "--max-queue", "2", "--no-kv-persist") as s:
        yield s, request.param


def client(srv):
    return openai.OpenAI(base_url=srv.base + "/v1", api_key="unused", max_retries=0, timeout=120)


def complete(srv, mid, prompt, **kw):
    r = client(srv).completions.create(model=mid, prompt=prompt, max_tokens=20, temperature=0, **kw)
    return r.choices[0].text, r.usage.completion_tokens


def in_threads(fns):
    results = [None] * len(fns)

    def wrap(i, fn):
        try:
            results[i] = fn()
        except Exception as e:  # noqa: BLE001 - compared by the caller
            results[i] = e
    threads = [threading.Thread(target=wrap, args=(i, fn), daemon=True) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    return threads, results


def join(threads):
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a request hung"


def test_four_concurrent_greedy_completions_equal_the_same_four_in_sequence(served):
    srv, mid = served
    pid = srv.engine_pid()
    stop_engine(pid)
    try:
        threads, together = in_threads([lambda p=p: complete(srv, mid, p, extra_body={"ignore_eos": True})
                                        for p in PROMPTS])
        h = srv.wait_health(lambda h: h["requests"]["active"] == 4)
        assert h["requests"]["queued"] == 0
    finally:
        resume_engine(pid)
    join(threads)
    alone = [complete(srv, mid, p, extra_body={"ignore_eos": True}) for p in PROMPTS]
    assert together == alone and all(n == 20 for _, n in alone)


def test_concurrent_chat_streams_equal_their_solo_runs(served):
    srv, mid = served
    c = client(srv)

    def chat(text):
        stream = c.chat.completions.create(model=mid, messages=[{"role": "user", "content": text}], max_tokens=12,
                                           temperature=0, stream=True, extra_body={"ignore_eos": True})
        return "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    alone = [chat(p) for p in PROMPTS]
    threads, together = in_threads([lambda p=p: chat(p) for p in PROMPTS])
    join(threads)
    assert together == alone


def test_queue_counts_the_running_requests(served):
    """4 run, --max-queue 2 wait, the rest get 429 before any stream."""
    srv, mid = served
    c0 = srv.health()["requests"]
    pid = srv.engine_pid()
    stop_engine(pid)
    try:
        threads, results = in_threads([lambda p=p: complete(srv, mid, p) for p in PROMPTS * 3])
        srv.wait_health(lambda h: h["requests"]["rejected"] - c0["rejected"] == 6 and h["requests"]["active"] == 4
                        and h["requests"]["queued"] == 2)
    finally:
        resume_engine(pid)
    join(threads)
    kinds = collections.Counter(type(r).__name__ for r in results)
    assert kinds == {"tuple": 6, "RateLimitError": 6}, results
    assert all(r.body["code"] == "queue_full" for r in results if isinstance(r, openai.RateLimitError))


def test_parallel_above_kv_slots_is_refused(oracle_root, tmp_path):
    import subprocess
    import sys
    from server_helpers import COLI
    model = convert(oracle_root, "llama", tmp_path / "llama")
    r = subprocess.run([sys.executable, str(COLI), "serve", "--model", str(model), "--kv-slots", "2", "--parallel", "3",
                        "--port", "0", "--no-kv-persist"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--parallel 3 must be between 1 and --kv-slots (2)" in r.stderr
