"""The dashboard in a real headless Chromium (tests/cdp.py) against `coli serve`: the scripted
streaming-MoE engine (fake_engine.py moe: READY expert fields, ROUTING frames, END tier stats)
for the telemetry, and the real engine for a server that reports no routing. Screenshots go to
build/screenshots/."""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cdp import Browser
import expert_atlas  # tools/ is on the path (pytest.ini)
from server_helpers import ROOT, ServerProc, model, post_json, request, template  # noqa: F401 (fixtures)

FAKE = Path(__file__).with_name("fake_engine.py")
SHOTS = ROOT / "build" / "screenshots"
TOOL_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}  # tools/ scripts import colibri from the checkout
MOE_ENV = {"COLI_ENGINE": str(FAKE), "COLI_FAKE_MODE": "moe", "COLI_FAKE_DELAY": "0.15"}
XSS = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def served(model, template, tmp_path_factory):  # noqa: F811
    log = tmp_path_factory.mktemp("fake") / "submits.jsonl"  # every SUBMIT the engine got
    with ServerProc(model, "--chat-template", template, "--no-kv-persist",
                    env={**MOE_ENV, "COLI_FAKE_LOG": str(log)}) as s:
        s.submits = lambda: [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        yield s


@pytest.fixture(scope="module")
def browser():
    b = Browser()
    yield b
    b.close()


def open_dashboard(b, server, width=1280, height=800):
    b.viewport(width, height)
    b.goto(server.base + "/")
    b.wait("window.coliState && coliState.ready && coliState.following")


def chat_turn(b, text="Hi", watch_counter=False):
    """Sends `text` from the page and waits for the answer and its telemetry event; returns the
    live counter texts seen while it streamed."""
    before = b.eval("coliState.chat.turns")
    events = b.eval("coliState.turnEvents || 0")
    b.eval(f"document.getElementById('prompt').value = {json.dumps(text)}; document.getElementById('send').click(); 1")
    seen = set()
    while watch_counter and b.eval(f"coliState.chat.turns === {before}"):
        seen.add(b.eval("document.getElementById('counter').textContent"))
    b.wait(f"coliState.chat.turns === {before + 1} && (coliState.syncedTurns || 0) > {events}")
    return seen


def assert_clean(b):
    assert b.events == [], f"console errors, exceptions or dialogs: {b.events}"
    assert b.eval("coliState.errors") == []


def test_dashboard_is_served_with_a_strict_csp(served):
    status, h, body = request(served.port, "GET", "/")
    assert status == 200 and h["content-type"].startswith("text/html")
    csp = h["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe-inline" not in csp
    assert h["x-content-type-options"] == "nosniff"
    html = body.decode()
    assert html.count("<script") == html.count('<script type="module" src="/ui/')  # no inline script
    for f in (ROOT / "web").iterdir():  # every file of web/ is served with its type
        status, h, data = request(served.port, "GET", f"/ui/{f.name}")
        assert status == 200 and data == f.read_bytes(), f.name
        assert "content-security-policy" in h
    assert request(served.port, "GET", "/ui/main.js")[1]["content-type"].startswith("text/javascript")
    for bad in ("/ui/../openai_server.py", "/ui/%2e%2e/coli", "/ui/nothing.js", "/ui/app.py"):
        assert request(served.port, "GET", bad)[0] == 404, bad
    assert request(served.port, "POST", "/", b"{}", {"Content-Type": "application/json"})[0] == 405


def test_chat_streams_with_counters_reasoning_and_inert_html(served, browser):
    open_dashboard(browser, served)
    seen = chat_turn(browser, "Show me some markup", watch_counter=True)
    assert any(s.startswith("generating…") and "tokens" in s for s in seen), seen  # the live counter ran
    counter = browser.eval("document.getElementById('counter').textContent")
    assert "tok/s" in counter and "TTFT" in counter and "3 → 13 tokens" in counter and "queue" in counter, counter
    last = browser.eval("coliState.chat.last")
    assert last["prompt_tokens"] == 3 and last["completion_tokens"] == 13
    assert last["tok_s"] > 0 and last["ttft_ms"] > 0 and last["queue_wait_ms"] >= 0
    msg = "document.querySelector('.msg.assistant')"
    assert browser.eval(f"{msg}.querySelector('details.reasoning .body').textContent") == "Checking the experts."
    assert browser.eval(f"getComputedStyle({msg}.querySelector('details.reasoning')).color") != \
        browser.eval(f"getComputedStyle({msg}.querySelector('.answer')).color")  # dimmed
    assert browser.eval(f"{msg}.querySelector('.answer strong').textContent") == "bold"
    assert browser.eval(f"{msg}.querySelectorAll('.answer ul li').length") == 2
    assert browser.eval(f"{msg}.querySelector('.answer pre code').textContent") == "x = 1"
    # the HTML in the answer is text: no element was made from it and nothing ran
    assert browser.eval("document.querySelectorAll('.log img').length") == 0
    assert XSS in browser.eval(f"{msg}.querySelector('.answer').textContent")
    assert_clean(browser)


def test_new_conversation_and_stop(served, browser):
    open_dashboard(browser, served)
    browser.eval("document.getElementById('prompt').value = 'long'; document.getElementById('send').click(); 1")
    browser.wait("coliState.chat.streaming && coliState.chat.tokens > 0")
    browser.eval("document.getElementById('stop').click(); 1")
    browser.wait("!coliState.chat.streaming")
    assert browser.eval("coliState.chat.last.stopped") is True
    assert "stopped" in browser.eval("document.getElementById('counter').textContent")
    browser.eval("document.getElementById('newchat').click(); 1")
    assert browser.eval("document.querySelectorAll('.log .msg').length") == 0
    served.wait_health(lambda h: h["requests"]["active"] == 0)
    assert_clean(browser)


def set_field(b, name, value):
    """Types `value` into the settings field `name` as a user would (an input event)."""
    b.eval(f"(() => {{ const i = document.querySelector('#settings [name={name}]'); i.value = {json.dumps(value)};"
           " i.dispatchEvent(new Event('input', {bubbles: true})); return 1; })()")


def test_chat_settings_persist_and_go_with_every_request(served, browser):
    open_dashboard(browser, served)
    browser.eval("localStorage.clear(); 1")
    open_dashboard(browser, served)
    fields = "Object.fromEntries(Array.from(document.querySelectorAll('#settings [name]')).map(i => [i.name, i.value]))"
    assert browser.eval(fields) == {"temperature": "", "top_p": "", "max_tokens": "1024", "system": ""}
    try:
        for name, value in (("temperature", "0.3"), ("top_p", "0.5"), ("max_tokens", "6"),
                            ("system", "You answer tersely.")):
            set_field(browser, name, value)
        open_dashboard(browser, served)  # a reload: the values come back from localStorage
        want = {"temperature": "0.3", "top_p": "0.5", "max_tokens": "6", "system": "You answer tersely."}
        assert browser.eval(fields) == want
        assert json.loads(browser.eval("localStorage.getItem('coli.chatSettings')")) == want
        n = len(served.submits())
        chat_turn(browser, "Hello")
        chat_turn(browser, "Again")  # the second request carries them too, the system prompt first
        sent = served.submits()[n:]
        assert len(sent) == 2
        for s in sent:
            assert (s["opts"]["temp"], s["opts"]["top_p"], s["opts"]["max_tokens"]) == ("0.3", "0.5", "6"), s["opts"]
            assert s["payload"].startswith("<|im_start|>system\nYou answer tersely.<|im_end|>"), s["payload"]
        assert sent[1]["payload"].count("You answer tersely.") == 1  # not repeated into the history
        assert "Hello" in sent[1]["payload"] and "Again" in sent[1]["payload"]
        assert browser.eval("coliState.chat.last.completion_tokens") == 6  # the cap held
        # Defaults: temperature and top-p left to the server, 1024 tokens, no system prompt
        browser.eval("document.querySelector('#settings [data-reset]').click(); 1")
        assert browser.eval(fields) == {"temperature": "", "top_p": "", "max_tokens": "1024", "system": ""}
        browser.eval("document.getElementById('newchat').click(); 1")
        chat_turn(browser, "Plain")
        last = served.submits()[-1]
        assert last["opts"]["max_tokens"] == "1024" and "fit" not in last["opts"] and "system" not in last["payload"]
        defaults = json.loads(request(served.port, "GET", "/v1/models")[2])["data"][0]["sampling_defaults"]
        assert float(last["opts"]["temp"]) == defaults["temperature"], (last["opts"], defaults)
    finally:
        browser.eval("localStorage.clear(); 1")
    assert_clean(browser)


def test_brain_flashes_the_experts_the_engine_routed(served, browser):
    open_dashboard(browser, served)
    before = browser.eval("Array.from(coliState.brain.flashes)")
    chat_turn(browser)
    _, _, data = request(served.port, "GET", "/v1/colibri/experts?history=1")
    doc = json.loads(data)
    routed = [[layer, row[j], row[j + 1]] for layer, row in enumerate(doc["history"][-1])
              for j in range(0, len(row), 2)]
    assert routed and browser.eval("coliState.brain.lastTurn") == routed
    after = browser.eval("Array.from(coliState.brain.flashes)")
    cells = {layer * doc["experts"] + e for layer, e, _ in routed}
    assert [i for i in range(len(after)) if after[i] != before[i]] == sorted(cells)
    assert all(after[i] == before[i] + 1 for i in cells)
    state = browser.eval("({l: coliState.brain.layers, e: coliState.brain.experts,"
                         " s: Array.from(coliState.brain.session),"
                         " c: Array.from(coliState.brain.cells)})")
    assert (state["l"], state["e"]) == (doc["layers"], doc["experts"]) == (2, 8)
    assert state["s"] == doc["session"] and state["c"] == doc["cells"]
    # hovering a cell names it
    browser.eval("document.querySelector('[data-view=brain]').click(); 1")
    browser.wait("coliState.brain.frames > 0 && document.getElementById('brain').clientWidth > 0")
    layer, expert, _ = routed[0]
    x, y = browser.eval(f"coliState.brain.centre({layer}, {expert})")
    browser.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
    tip = browser.wait("!document.getElementById('tip').hidden && document.getElementById('tip').textContent")
    assert f"expert {expert}" in tip and f"layer {doc['layer_index'][layer]}" in tip and "heat" in tip, tip
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.screenshot(SHOTS / "dashboard-brain-1280x800.png")
    assert_clean(browser)


def test_tier_bar_matches_the_experts_endpoint(served, browser):
    open_dashboard(browser, served)
    chat_turn(browser)
    _, _, data = request(served.port, "GET", "/v1/colibri/experts")
    tiers = json.loads(data)["tiers"]
    assert tiers["total"] == 16 and tiers["pinned"] == 1 and tiers["cached"] + tiers["disk"] == 16
    assert browser.eval("coliState.tiers") == tiers
    bar = browser.eval("Object.assign({}, document.getElementById('tierbar').dataset)")
    assert bar == {k: str(v) for k, v in tiers.items()}
    widths = browser.eval("Array.from(document.querySelectorAll('#tierbar .seg')).map(s => s.style.width)")
    want = [tiers["pinned"], tiers["cached"] - tiers["pinned"], tiers["disk"]]
    assert [round(float(w.rstrip("%")), 3) for w in widths] == [round(100 * v / 16, 3) for v in want]
    legend = browser.eval("document.getElementById('tierlegend').textContent")
    assert f"pinned {want[0]}" in legend and f"cached {want[1]}" in legend and f"on disk {want[2]}" in legend
    # the runtime panel: engine settings and the last turn's breakdown
    engine = browser.eval("document.getElementById('engine').textContent")
    assert "RAM budget" in engine and "1.1 GB" in engine and "4 of 8 per layer" in engine
    assert "expert I/O wait 3.5 ms" in browser.eval("document.getElementById('breaklegend').textContent")
    assert "cores" in browser.eval("document.getElementById('machine').textContent")
    browser.screenshot(SHOTS / "dashboard-chat-1280x800.png")
    assert_clean(browser)


def test_atlas_is_built_live_from_the_servers_turns(model, template, browser):  # noqa: F811
    (model / "experts.json").unlink(missing_ok=True)  # no saved atlas: the server builds one
    with ServerProc(model, "--chat-template", template, "--no-kv-persist", env=MOE_ENV) as s:
        status, _, data = request(s.port, "GET", "/v1/colibri/atlas")
        err = json.loads(data)["error"]
        assert status == 404 and err["code"] == "atlas_missing"
        assert "chat a few turns" in err["message"] and "tools/expert_atlas.py" in err["message"]
        open_dashboard(browser, s)
        browser.eval("document.querySelector('[data-view=atlas]').click(); 1")
        empty = browser.wait("coliState.atlas.error && !document.getElementById('atlasempty').hidden"
                             " && document.getElementById('atlasempty').textContent")
        assert "chat a few turns" in empty and "tools/expert_atlas.py" in empty  # the page says how to fill it
        assert browser.eval("document.getElementById('atlasempty').getBoundingClientRect().height") > 0
        assert browser.eval("coliState.atlas.loaded") is False
        expected = ("log", "Failed to load resource: the server responded with a status of 404 (Not Found)")
        assert browser.events == [expected]  # the browser's own note of the 404, and nothing else
        browser.events.clear()
        for _ in range(2):
            post_json(s.port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})
        status, _, data = request(s.port, "GET", "/v1/colibri/atlas")
        live = json.loads(data)
        assert status == 200 and live["source"] == "live" and live["turns"] == 2 and len(live["points"]) == 16
        hist = json.loads(request(s.port, "GET", "/v1/colibri/experts?history=1")[2])
        tool = expert_atlas.layout(hist)  # the same layout the tool writes, from the same turns
        assert live["points"] == json.loads(json.dumps(tool["points"]))
        assert sum(p[5] for p in live["points"]) == sum(hist["session"]) > 0
        browser.eval("document.querySelector('[data-view=chat]').click();"
                     " document.querySelector('[data-view=atlas]').click(); 1")
        browser.wait("coliState.atlas.loaded")
        assert browser.eval("coliState.atlas.points") == 16 and browser.eval("coliState.atlas.source") == "live"
        assert browser.eval("document.getElementById('atlasempty').hidden") is True
        assert "recent turns" in browser.eval("document.getElementById('atlasnote').textContent")
        # a third turn: the next visit shows an atlas of three
        post_json(s.port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})
        assert json.loads(request(s.port, "GET", "/v1/colibri/atlas")[2])["turns"] == 3
        assert_clean(browser)


def test_atlas_from_the_tool(served, browser, model):  # noqa: F811
    for _ in range(2):  # at least two turns, so co-activation is defined
        post_json(served.port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})
    out = model / "experts.json"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "expert_atlas.py"), "--server", served.base,
                        "--out", str(out)], capture_output=True, text=True, timeout=120, env=TOOL_ENV)
    assert r.returncode == 0, r.stderr
    atlas = json.loads(out.read_text())
    assert atlas["layers"] == 2 and atlas["experts"] == 8 and len(atlas["points"]) == 16
    open_dashboard(browser, served)
    browser.eval("document.querySelector('[data-view=atlas]').click(); 1")
    browser.wait("coliState.atlas.loaded")
    assert browser.eval("coliState.atlas.points") == 16 and browser.eval("coliState.atlas.source") == "file"
    yaw = browser.eval("coliState.atlas.yaw")
    r = browser.eval("(() => { const r = document.getElementById('atlas').getBoundingClientRect();"
                     " return [r.left + r.width / 2, r.top + r.height / 2]; })()")
    for kind, dx in (("mousePressed", 0), ("mouseMoved", 60), ("mouseReleased", 60)):
        browser.call("Input.dispatchMouseEvent", {"type": kind, "x": r[0] + dx, "y": r[1], "button": "left",
                                                  "buttons": 1 if kind != "mouseReleased" else 0, "clickCount": 1})
    assert browser.eval("coliState.atlas.yaw") != yaw  # dragging rotates
    browser.call("Input.dispatchMouseEvent", {"type": "mouseWheel", "x": r[0], "y": r[1], "deltaX": 0, "deltaY": -200})
    browser.wait("coliState.atlas.zoom > 1")
    browser.screenshot(SHOTS / "dashboard-atlas-1280x800.png")
    assert_clean(browser)


def test_phone_width_folds_the_sidebar_without_overflow(served, browser):
    open_dashboard(browser, served, 390, 844)
    chat_turn(browser, "A long question " * 20)
    overflow = "document.documentElement.scrollWidth - window.innerWidth"
    assert browser.eval("getComputedStyle(document.getElementById('side')).display") == "none"
    for view in ("brain", "atlas", "chat"):
        browser.eval(f"document.querySelector('[data-view={view}]').click(); 1")
        assert browser.eval(overflow) <= 0, view
    browser.screenshot(SHOTS / "dashboard-chat-390x844.png")
    browser.eval("document.getElementById('fold').click(); 1")
    assert browser.eval("getComputedStyle(document.getElementById('side')).display") == "block"
    assert browser.eval(overflow) <= 0
    browser.screenshot(SHOTS / "dashboard-runtime-390x844.png")
    browser.eval("document.getElementById('fold').click(); 1")
    assert_clean(browser)


def test_events_stream_one_turn_per_event(served):
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    conn.request("GET", "/v1/colibri/events")
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("content-type").startswith("text/event-stream")
    assert r.readline() == b"event: hello\n"
    r.readline(), r.readline()
    threading.Thread(target=post_json, args=(served.port, "/v1/chat/completions",
                                             {"messages": [{"role": "user", "content": "Hi"}]}), daemon=True).start()
    lines = [r.readline() for _ in range(3)]
    conn.close()
    assert lines[0] == b"event: turn\n" and lines[1].startswith(b"id: ")
    turn = json.loads(lines[2][len(b"data: "):])
    assert turn["completion_tokens"] == 13 and turn["io_wait_ms"] == 3.5 and turn["hit_rate"] == 0.75
    assert turn["decode_ms"] == 240.0 and turn["prefill_ms"] == 12.5 and turn["queue_wait_ms"] >= 0
    _, _, data = request(served.port, "GET", "/v1/colibri/experts?history=1")
    assert turn["routing"] == json.loads(data)["history"][-1] and len(turn["routing"]) == 2  # per MoE layer


def test_runtime_endpoint(served, model):  # noqa: F811
    _, _, data = request(served.port, "GET", "/v1/colibri/runtime")
    rt = json.loads(data)
    assert rt["engine"]["ram_budget"] == 1 << 30 and rt["engine"]["cap"] == 4 and rt["engine"]["kv_slots"] == 4
    assert rt["machine"]["cpu"]["logical"] >= 1 and rt["machine"]["memory"]["total"] > 0
    assert rt["machine"]["disk"]["free"] > 0 and rt["turns"] and rt["telemetry"]["turns"] == len(rt["turns"])
    usage = json.loads((model / ".coli_usage").read_text())
    _, _, data = request(served.port, "GET", "/v1/colibri/experts")
    assert json.loads(data)["usage"] == [c for row in usage["counts"] for c in row]


def test_api_key_is_asked_for_and_kept_in_session_storage(model, template, browser):  # noqa: F811
    with ServerProc(model, "--chat-template", template, "--no-kv-persist", "--api-key", "s3cret", env=MOE_ENV) as s:
        assert request(s.port, "GET", "/v1/colibri/experts")[0] == 401
        assert request(s.port, "GET", "/")[0] == 200  # the page itself is public; it holds no data
        browser.viewport(1280, 800)
        browser.goto(s.base + "/")
        browser.wait("coliState.needKey === true && !document.getElementById('keyform').hidden")
        browser.eval("document.getElementById('key').value = 's3cret';"
                     "document.getElementById('keyform').requestSubmit(); 1")
        browser.wait("coliState.ready && coliState.following")
        assert browser.eval("sessionStorage.getItem('coli.apiKey')") == "s3cret"
        assert browser.eval("localStorage.length") == 0
        chat_turn(browser)
        assert browser.eval("coliState.chat.last.completion_tokens") == 13
        assert_clean(browser)
        browser.goto("about:blank")  # before the server goes away under the page


def test_real_engine_without_routing(oracle_root, tmp_path_factory, browser):
    """Today's engine advertises no experts in READY, so SUBMIT carries no routing=1 (it would
    refuse it): the chat works, the Brain shows the grid with every expert resident."""
    from server_helpers import convert
    m = convert(oracle_root, "qwen3_moe", tmp_path_factory.mktemp("web-real") / "qwen3_moe")
    # greedy (the page sends no temperature): a sampled first token may be end-of-sequence
    (m / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.0}))
    with ServerProc(m, "--chat-template", str(m.parent / "chatml.jinja"), "--no-kv-persist") as s:
        browser.viewport(1280, 800)
        browser.goto(s.base + "/")
        browser.wait("coliState.ready && coliState.following")
        browser.eval("document.getElementById('prompt').value = 'Hi'; document.getElementById('send').click(); 1")
        browser.wait("coliState.chat.turns === 1 && (coliState.syncedTurns || 0) >= 1", timeout=120)
        assert browser.eval("coliState.chat.error") is None
        assert browser.eval("coliState.chat.last.completion_tokens") > 0
        doc = json.loads(s.request("GET", "/v1/colibri/experts")[2])
        assert (doc["layers"], doc["experts"]) == (2, 8)
        assert browser.eval("[coliState.brain.layers, coliState.brain.experts]") == [2, 8]
        assert browser.eval("Array.from(coliState.brain.cells)") == doc["cells"]
        assert_clean(browser)
        browser.goto("about:blank")


def test_coli_web_opens_the_browser_when_ready(model, template, tmp_path):  # noqa: F811
    opened = tmp_path / "opened"
    fake_browser = tmp_path / "browser.sh"
    fake_browser.write_text(f"#!/bin/sh\necho \"$1\" > {opened}\n")
    fake_browser.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLI_")}
    env.update(MOE_ENV, BROWSER=str(fake_browser))
    for extra in ([], ["--no-browser"]):
        opened.unlink(missing_ok=True)
        p = subprocess.Popen([sys.executable, str(ROOT / "coli"), "web", "--model", str(model), "--port", "0",
                              "--chat-template", template, "--no-kv-persist", "--quiet", *extra],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
        try:
            line = p.stdout.readline()
            assert line.startswith("dashboard: http://127.0.0.1:"), line
            url = line.split()[1]
            port = int(url.rsplit(":", 1)[1].strip("/"))
            deadline = time.monotonic() + 30
            while json.loads(request(port, "GET", "/health")[2])["status"] != "ok" and time.monotonic() < deadline:
                time.sleep(0.05)
            if extra:
                assert "opens" not in line
                time.sleep(1.0)  # the opener would have run within 0.2 s of READY
                assert not opened.exists()
            else:
                while not opened.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert opened.read_text().strip() == url
            assert request(port, "GET", "/")[0] == 200
        finally:
            p.terminate()
            p.wait(timeout=30)


def test_brain_at_glm5_scale(model, template, browser, tmp_path):  # noqa: F811
    """76 MoE layers x 256 experts (GLM-5's shape): the grid is drawn from one image per frame;
    the frame cost is printed (a measurement, not a pass mark)."""
    big = tmp_path / "big"
    shutil.copytree(model, big, ignore=shutil.ignore_patterns(".coli_*", "experts.json"))
    man = json.loads((big / "colibri.json").read_text())
    man["arch"].update(num_experts=256, layer_mlp=["moe"] * 76)
    (big / "colibri.json").write_text(json.dumps(man))
    with ServerProc(big, "--chat-template", template, "--no-kv-persist", env={**MOE_ENV, "COLI_FAKE_DELAY": "0"}) as s:
        open_dashboard(browser, s)
        for _ in range(12):
            chat_turn(browser)
        doc = json.loads(s.request("GET", "/v1/colibri/experts?history=1")[2])
        assert (doc["layers"], doc["experts"]) == (76, 256)
        routed = [[layer, row[j], row[j + 1]] for layer, row in enumerate(doc["history"][-1])
                  for j in range(0, len(row), 2)]
        assert browser.eval("coliState.brain.lastTurn") == routed and len(routed) == 76 * 8
        assert browser.eval("Array.from(coliState.brain.session)") == doc["session"]
        browser.eval("document.querySelector('[data-view=brain]').click(); 1")
        browser.wait("coliState.brain.frames > 0 && coliState.brain.drawMs !== undefined")
        frames = browser.eval("coliState.brain.frames")
        chat_turn(browser)  # the flash animates: frames keep coming while it fades
        browser.wait(f"coliState.brain.frames > {frames + 5}")
        print(f"Brain 76x256: {browser.eval('coliState.brain.drawMs'):.2f} ms per frame")
        browser.screenshot(SHOTS / "dashboard-brain-76x256-1280x800.png")
        assert_clean(browser)
        browser.goto("about:blank")


def test_an_open_event_stream_does_not_hold_up_shutdown(model, template):  # noqa: F811
    import http.client
    s = ServerProc(model, "--chat-template", template, "--no-kv-persist", "--shutdown-timeout", "120", env=MOE_ENV)
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
    try:
        conn.request("GET", "/v1/colibri/events")
        r = conn.getresponse()
        assert r.readline() == b"event: hello\n"
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=60) == 0  # within the stream's one-second check, not --shutdown-timeout
        assert "every request in progress finished" in s.log()
    finally:
        conn.close()
        s.stop()


def test_a_routing_frame_of_the_wrong_shape_costs_only_the_telemetry(model, template):  # noqa: F811
    env = {**MOE_ENV, "COLI_FAKE_DELAY": "0", "COLI_FAKE_BAD_ROUTING": "1"}
    with ServerProc(model, "--chat-template", template, "--no-kv-persist", env=env) as s:
        status, _, body = post_json(s.port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})
        assert status == 200 and body["usage"]["completion_tokens"] == 13
        doc = json.loads(s.request("GET", "/v1/colibri/experts")[2])
        assert doc["session"] == [0] * 16 and doc["turns"] == 1  # the turn counted, its routing not
        assert "ROUTING frame ignored: ROUTING frame of 3x8 experts carries 64 bytes" in s.log()
        assert s.health()["engine"]["restarts"] == 0
