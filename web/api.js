// The server the page came from (telemetry) and the OpenAI endpoint the chat talks to (any
// compatible one). The API key lives in sessionStorage: it is gone when the tab closes.

const KEY = 'coli.apiKey';
const BASE = 'coli.baseUrl';

export function apiKey() { return sessionStorage.getItem(KEY) || ''; }
/** @param {string} k */
export function setApiKey(k) { if (k) sessionStorage.setItem(KEY, k); else sessionStorage.removeItem(KEY); }
export function baseUrl() { return sessionStorage.getItem(BASE) || `${location.origin}/v1`; }
/** @param {string} u */
export function setBaseUrl(u) { sessionStorage.setItem(BASE, u.replace(/\/+$/, '')); }

/** @param {Record<string,string>} [extra] */
export function headers(extra = {}) {
  const h = { ...extra };
  if (apiKey()) h.Authorization = `Bearer ${apiKey()}`;
  return h;
}

export class AuthError extends Error {}

/** GET a JSON document of this server. @param {string} path */
export async function getJSON(path) {
  const r = await fetch(path, { headers: headers(), cache: 'no-store' });
  if (r.status === 401) throw new AuthError('API key needed');
  if (!r.ok) {
    let msg = `${r.status}`;
    try { msg = (await r.json()).error.message; } catch { /* not JSON */ }
    const e = new Error(msg);
    /** @type {any} */ (e).status = r.status;
    throw e;
  }
  return r.json();
}

/**
 * Reads a server-sent event stream from a fetch Response, calling onEvent(name, data, id) per event.
 * @param {Response} resp @param {(name: string, data: string, id: string) => void} onEvent
 */
export async function readSSE(resp, onEvent) {
  if (!resp.body) throw new Error('the response has no body to stream');
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let cut;
    while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut).replace(/^\r?\n\r?\n/, '');
      let name = 'message', id = '';
      const data = [];
      for (const line of block.split(/\r?\n/)) {
        if (line.startsWith('event:')) name = line.slice(6).trim();
        else if (line.startsWith('id:')) id = line.slice(3).trim();
        else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
      }
      if (data.length) onEvent(name, data.join('\n'), id);
    }
  }
}

/**
 * Follows /v1/colibri/events, reconnecting after a pause when it drops. The stream closes when
 * the page is hidden (a browser holds only six connections per server, and a page kept in the
 * back-forward cache would keep its stream) and reopens when the page comes back.
 * @param {(turn: any) => void} onTurn @param {() => void} [onHello]
 */
export function followEvents(onTurn, onHello) {
  let after = -1;
  /** @type {AbortController|null} */
  let live = null;
  const connect = async () => {
    const ctl = live = new AbortController();
    try {
      const q = after >= 0 ? `?after=${after}` : '';
      const r = await fetch(`/v1/colibri/events${q}`, { headers: headers(), cache: 'no-store', signal: ctl.signal });
      if (!r.ok) throw new Error(`events: ${r.status}`);
      await readSSE(r, (name, data, id) => {
        const d = JSON.parse(data);
        if (name === 'hello') {
          if (after < 0) after = d.seq;
          if (onHello) onHello();
        } else if (name === 'turn') { after = Number(id); onTurn(d); }
      });
    } catch { /* the server restarted or went away, or the page was hidden */ }
    if (!ctl.signal.aborted) setTimeout(connect, 2000);
  };
  window.addEventListener('pagehide', () => { if (live) live.abort(); });
  window.addEventListener('pageshow', (e) => { if (e.persisted) connect(); });
  connect();
}
