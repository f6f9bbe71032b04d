"""`coli web`: `coli serve` plus the browser. The API and the dashboard share one port; the
dashboard opens (webbrowser, so $BROWSER is honoured) once the engine is ready, and the URL is
printed either way."""
import sys
import threading
import time
import webbrowser

from colibri.server import app as server_app

HELP = "serve the API and the dashboard (chat, runtime, Brain, Atlas) and open it in the browser"
DESCRIPTION = ("Serve the model like `coli serve` (every serve flag applies) and open the dashboard at / in the "
               "browser once the engine is ready: chat with live metrics, the runtime panel with the expert tiers, "
               "the Brain (every routed expert) and the Atlas. $BROWSER picks the browser; --no-browser only prints "
               "the URL.")


def add_arguments(parser):
    server_app.add_arguments(parser)
    parser.add_argument("--no-browser", action="store_true", help="print the dashboard's URL, do not open a browser")


def browser_url(url):
    """A URL a local browser can open: a wildcard bind address becomes loopback."""
    return url.replace("://0.0.0.0:", "://127.0.0.1:").replace("://[::]:", "://[::1]:")


def run(args):
    def on_listen(app, url):
        url = browser_url(url)
        print(f"dashboard: {url}" + ("" if args.no_browser else " (opens in the browser when the model is loaded)"),
              flush=True)
        if not args.no_browser:
            threading.Thread(target=open_when_ready, args=(app, url), name="browser", daemon=True).start()
    return server_app.run(args, on_listen=on_listen)


def open_when_ready(app, url):
    while app.sched.status()["state"] not in ("ready", "failed", "stopped"):
        time.sleep(0.2)
    if app.sched.status()["state"] != "ready":
        return  # the log says why; the URL is printed already
    try:
        if not webbrowser.open(url):
            print(f"coli web: no browser found; open {url} yourself", file=sys.stderr, flush=True)
    except webbrowser.Error as e:
        print(f"coli web: could not open a browser ({e}); open {url} yourself", file=sys.stderr, flush=True)
