// The chat's sampling settings: temperature, top-p, max tokens and a system prompt, kept in
// localStorage (they outlive the tab, unlike the API key) and sent with every request. An empty
// temperature or top-p leaves the field out, so the server's sampling defaults apply; max tokens
// defaults to 1024 so a model that loops stops long before the end of the context.

const KEY = 'coli.chatSettings';
export const DEFAULTS = Object.freeze({ temperature: '', top_p: '', max_tokens: '1024', system: '' });
/** @typedef {{temperature: string, top_p: string, max_tokens: string, system: string}} Settings */

/** @returns {Settings} */
export function loadSettings() {
  /** @type {any} */
  let saved = {};
  try { saved = JSON.parse(localStorage.getItem(KEY) || '{}') || {}; } catch { /* damaged: defaults */ }
  /** @type {any} */
  const out = { ...DEFAULTS };
  for (const k of Object.keys(DEFAULTS)) if (typeof saved[k] === 'string') out[k] = saved[k];
  return out;
}

/** @param {Settings} s */
export function saveSettings(s) { localStorage.setItem(KEY, JSON.stringify(s)); }

/**
 * The request fields the settings add; a field that is empty or not a number is left out.
 * @param {Settings} s @returns {Record<string, number>}
 */
export function requestFields(s) {
  /** @type {Record<string, number>} */
  const out = {};
  const put = (/** @type {string} */ name, /** @type {string} */ text, /** @type {boolean} */ int) => {
    const t = text.trim();
    if (!t) return;
    const v = Number(t);
    if (Number.isFinite(v) && (!int || Number.isInteger(v))) out[name] = v;
  };
  put('temperature', s.temperature, false);
  put('top_p', s.top_p, false);
  // n_predict (llama-server's cap), not max_tokens: the end of the context may cut it short
  // instead of a default of 1024 refusing a short prompt on a small --ctx
  put('n_predict', s.max_tokens, true);
  return out;
}

/** The messages to send: the system prompt (when set) first, then the conversation.
 * @param {Settings} s @param {{role: string, content: string}[]} messages */
export function withSystem(s, messages) {
  return s.system.trim() ? [{ role: 'system', content: s.system }, ...messages] : messages;
}

/**
 * Binds the settings form: its inputs show the stored values, and every edit is stored at once.
 * @param {HTMLFormElement} form inputs named after the settings' keys
 * @param {(s: Settings) => void} onChange
 */
export function bindSettings(form, onChange) {
  const s = loadSettings();
  const inputs = /** @type {(HTMLInputElement|HTMLTextAreaElement)[]} */ (Array.from(form.querySelectorAll('[name]')));
  for (const i of inputs) i.value = /** @type {any} */ (s)[i.name] ?? '';
  const store = () => {
    /** @type {any} */
    const next = { ...DEFAULTS };
    for (const i of inputs) next[i.name] = i.value;
    saveSettings(next);
    onChange(next);
  };
  form.addEventListener('input', store);
  form.addEventListener('submit', (e) => e.preventDefault());
  const reset = form.querySelector('[data-reset]');
  if (reset) reset.addEventListener('click', () => {
    for (const i of inputs) i.value = /** @type {any} */ (DEFAULTS)[i.name] ?? '';
    store();
  });
  onChange(s);
  return s;
}
