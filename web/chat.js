// The chat: speaks only the OpenAI chat-completions API (streaming), so the base URL may point
// at any compatible server. Counters: tokens while generating, then tok/s, TTFT, prompt ->
// completion tokens and the server's queue wait. The settings (settings.js) go with every request.
import { baseUrl, headers, readSSE } from './api.js';
import { render } from './markdown.js';
import { DEFAULTS, requestFields, withSystem } from './settings.js';
import { el, num } from './util.js';

export class Chat {
  /** @param {any} state the page's shared state (window.coliState) */
  constructor(state) {
    this.state = state;
    /** @type {{role: string, content: string}[]} */
    this.messages = [];
    /** @type {AbortController|null} */
    this.abort = null;
    this.model = '';
    /** @type {import('./settings.js').Settings} */
    this.settings = { ...DEFAULTS };
    this.log = /** @type {HTMLElement} */ (document.getElementById('log'));
    this.counter = /** @type {HTMLElement} */ (document.getElementById('counter'));
    this.send = /** @type {HTMLButtonElement} */ (document.getElementById('send'));
    this.stop = /** @type {HTMLButtonElement} */ (document.getElementById('stop'));
    state.chat = { streaming: false, tokens: 0, turns: 0, last: null, error: null };
  }

  reset() {
    if (this.abort) this.abort.abort();
    this.messages = [];
    this.log.replaceChildren();
    this.counter.textContent = 'new conversation';
  }

  async pickModel() {
    const r = await fetch(`${baseUrl()}/models`, { headers: headers() });
    if (!r.ok) throw new Error(`GET ${baseUrl()}/models answered ${r.status}`);
    const list = await r.json();
    this.model = list.data && list.data.length ? list.data[0].id : '';
    return this.model;
  }

  /** @param {string} text */
  async ask(text) {
    if (this.abort) return;
    this.messages.push({ role: 'user', content: text });
    this.log.append(el('div', { class: 'msg user' }, [text]));
    const box = el('div', { class: 'msg assistant' });
    const think = /** @type {HTMLDetailsElement} */ (el('details', { class: 'reasoning', hidden: '' }, [el('summary', {}, ['Reasoning']), el('div', { class: 'body' })]));
    const answer = el('div', { class: 'answer' });
    box.append(think, answer);
    this.log.append(box);
    this.log.scrollTop = this.log.scrollHeight;

    const st = this.state.chat;
    st.streaming = true; st.tokens = 0; st.error = null;
    this.abort = new AbortController();
    this.send.disabled = true; this.stop.disabled = false;
    let content = '', reasoning = '', stopped = false;
    /** @type {{prompt_tokens: number, completion_tokens: number}|null} */
    let usage = null;
    /** @type {number|null} */
    let queueMs = null;
    const t0 = performance.now();
    let tFirst = 0, tLast = 0, drawn = false;
    const draw = () => {
      drawn = false;
      answer.replaceChildren(render(content));
      /** @type {HTMLElement} */ (think.querySelector('.body')).textContent = reasoning;
      const dt = tLast > tFirst ? (tLast - tFirst) / 1000 : 0;
      if (st.streaming) this.counter.textContent = `generating… ${st.tokens} tokens` + (dt ? ` · ${num((st.tokens - 1) / dt, 1)} tok/s` : '');
      this.log.scrollTop = this.log.scrollHeight;
    };
    const later = () => { if (!drawn) { drawn = true; requestAnimationFrame(draw); } };
    try {
      if (!this.model) await this.pickModel();
      const r = await fetch(`${baseUrl()}/chat/completions`, {
        method: 'POST', signal: this.abort.signal,
        headers: headers({ 'Content-Type': 'application/json' }),
        body: JSON.stringify({ model: this.model, messages: withSystem(this.settings, this.messages),
          ...requestFields(this.settings), stream: true, stream_options: { include_usage: true } }),
      });
      const q = r.headers.get('x-colibri-queue-wait-ms');
      queueMs = q === null ? null : Number(q);
      if (!r.ok) {
        let msg = `${r.status}`;
        try { msg = (await r.json()).error.message; } catch { /* not JSON */ }
        throw new Error(msg);
      }
      await readSSE(r, (_name, data) => {
        if (data === '[DONE]') return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message || 'the stream ended with an error');
        if (chunk.usage) usage = chunk.usage;
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (!delta) return;
        const piece = (delta.content || '') + (delta.reasoning_content || '');
        if (!piece) return;
        const now = performance.now();
        if (!tFirst) tFirst = now;
        tLast = now;
        st.tokens += 1;
        if (delta.reasoning_content) {
          reasoning += delta.reasoning_content;
          think.hidden = false;
          if (!content) think.open = true;
        }
        if (delta.content) {
          if (!content) think.open = false;
          content += delta.content;
        }
        later();
      });
    } catch (e) {
      if (this.abort.signal.aborted) stopped = true;
      else {
        st.error = String(/** @type {Error} */ (e).message || e);
        box.append(el('div', { class: 'msg error' }, [st.error]));
      }
    } finally {
      draw();
      this.abort = null;
      this.send.disabled = false; this.stop.disabled = true;
      st.streaming = false;
    }
    if (content || reasoning) this.messages.push({ role: 'assistant', content });
    // set inside the stream's callback, which the type checker cannot follow
    const u = /** @type {{prompt_tokens: number, completion_tokens: number}|null} */ (usage);
    const completion = u ? u.completion_tokens : st.tokens;
    const dt = tLast > tFirst ? (tLast - tFirst) / 1000 : 0;
    const last = {
      completion_tokens: completion, prompt_tokens: u ? u.prompt_tokens : null,
      tok_s: dt && completion > 1 ? (completion - 1) / dt : null,
      ttft_ms: tFirst ? tFirst - t0 : null, queue_wait_ms: queueMs, stopped,
    };
    st.last = last; st.turns += 1;
    this.counter.replaceChildren(...stats(last));
  }

  cancel() { if (this.abort) this.abort.abort(); }
}

/** @param {any} s @returns {Node[]} */
function stats(s) {
  /** @type {[string, string, string][]} label, value, unit */
  const parts = [['', num(s.tok_s, 1), ' tok/s'], ['TTFT ', num(s.ttft_ms), ' ms'],
    ['', `${s.prompt_tokens ?? '–'} → ${s.completion_tokens}`, ' tokens'], ['queue ', num(s.queue_wait_ms), ' ms']];
  const out = [];
  parts.forEach(([label, value, unit], i) => {
    out.push(document.createTextNode(`${i ? ' · ' : ''}${label}`), el('b', {}, [value]), document.createTextNode(unit));
  });
  if (s.stopped) out.push(document.createTextNode(' · stopped'));
  return out;
}
