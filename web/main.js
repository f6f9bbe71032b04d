// The dashboard's entry point: wires the chat, the runtime panel, the Brain and the Atlas to
// the server, and exposes their state as window.coliState (tests read it; so can a console).
import { AuthError, apiKey, baseUrl, followEvents, headers, setApiKey, setBaseUrl } from './api.js';
import { Atlas } from './atlas.js';
import { Brain, TIERS } from './brain.js';
import { Chat } from './chat.js';
import { Runtime } from './runtime.js';
import { bindSettings } from './settings.js';
import { cssVar, fillLegend } from './util.js';

/** @type {any} */
const state = { errors: [], status: 'loading', ready: false, view: 'chat' };
/** @type {any} */ (window).coliState = state;
window.addEventListener('error', (e) => state.errors.push(String(e.message)));
window.addEventListener('unhandledrejection', (e) => state.errors.push(String(e.reason)));

const $ = (/** @type {string} */ id) => /** @type {HTMLElement} */ (document.getElementById(id));
const chat = new Chat(state);
const runtime = new Runtime(state);
const brain = new Brain(/** @type {HTMLCanvasElement} */ ($('brain')), $('tip'), state);
const atlas = new Atlas(/** @type {HTMLCanvasElement} */ ($('atlas')), $('atlasnote'), $('atlasempty'), state);

fillLegend($('brainlegend'), TIERS.map((t, i) => [cssVar(['--disk', '--cached', '--pinned', '--resident'][i]), t, '']));

// --- views and the folding sidebar -------------------------------------------------------
document.querySelectorAll('.tabs button').forEach((b) => b.addEventListener('click', () => {
  const view = /** @type {HTMLElement} */ (b).dataset.view || 'chat';
  state.view = view;
  document.querySelectorAll('.tabs button').forEach((o) => o.setAttribute('aria-selected', String(o === b)));
  document.querySelectorAll('.view').forEach((v) => { /** @type {HTMLElement} */ (v).dataset.active = String(v.id === `view-${view}`); });
  if (view === 'atlas') atlas.load();
  if (view === 'brain') brain.draw();
}));
$('fold').addEventListener('click', () => {
  const side = $('side'), open = side.dataset.open !== 'true';
  side.dataset.open = String(open);
  $('fold').setAttribute('aria-expanded', String(open));
});

// --- chat --------------------------------------------------------------------------------
const base = /** @type {HTMLInputElement} */ ($('base'));
base.value = baseUrl();
base.addEventListener('change', () => { setBaseUrl(base.value); chat.model = ''; });
$('newchat').addEventListener('click', () => chat.reset());
bindSettings(/** @type {HTMLFormElement} */ ($('settings')), (s) => { chat.settings = s; state.settings = s; });
$('stop').addEventListener('click', () => chat.cancel());
window.addEventListener('pagehide', () => chat.cancel());  // a page leaving stops its generation
const prompt = /** @type {HTMLTextAreaElement} */ ($('prompt'));
$('ask').addEventListener('submit', (e) => {
  e.preventDefault();
  const text = prompt.value.trim();
  if (!text) return;
  prompt.value = '';
  chat.ask(text);
});
prompt.addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey) { e.preventDefault(); /** @type {HTMLFormElement} */ ($('ask')).requestSubmit(); }
});

// --- the server: key, health, telemetry ------------------------------------------------------
$('keyform').addEventListener('submit', (e) => {
  e.preventDefault();
  setApiKey(/** @type {HTMLInputElement} */ ($('key')).value.trim());
  $('keyform').hidden = true;
  start();
});

async function refresh() {
  const ex = await runtime.refresh();
  brain.setExperts(ex);
  $('model').textContent = state.runtime.model;
}

async function pollHealth() {
  try {
    const r = await fetch('/health', { cache: 'no-store' });
    const h = await r.json();
    state.status = h.status;
  } catch {
    state.status = 'unreachable';
  }
  const s = $('status');
  s.dataset.state = state.status;
  s.textContent = state.status;
  setTimeout(pollHealth, state.status === 'ok' ? 5000 : 1000);
}

let following = false;
async function start() {
  try {
    const auth = await (await fetch('/v1/colibri/auth', { headers: headers(), cache: 'no-store' })).json();
    if (auth.required && !auth.authorized) {
      if (apiKey()) setApiKey('');
      state.needKey = true;
      $('keyform').hidden = false;
      /** @type {HTMLInputElement} */ ($('key')).focus();
      return;
    }
    state.needKey = false;
    await refresh();
  } catch (e) {
    if (e instanceof AuthError) {
      $('keyform').hidden = false;
      if (apiKey()) setApiKey('');
      return;
    }
    setTimeout(start, 1000);  // still loading: try again
    return;
  }
  state.ready = true;
  if (!following) {
    following = true;
    followEvents((turn) => {
      const n = state.turnEvents = (state.turnEvents || 0) + 1;
      brain.onTurn(turn);
      // syncedTurns: the panels show the state after turn n (tests wait for it)
      refresh().catch(() => {}).finally(() => { state.syncedTurns = Math.max(state.syncedTurns || 0, n); });
    }, () => { state.following = true; });
  }
}

pollHealth();
start();
