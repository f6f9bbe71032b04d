// The runtime panel: machine, engine settings (RAM budget included), the expert-tier bar, the
// last turn's time breakdown and the tok/s trend.
import { getJSON } from './api.js';
import { bytes, cssVar, fillLegend, fillList, num } from './util.js';

/** @param {HTMLElement} bar @param {number[]} parts */
function setBar(bar, parts) {
  const total = parts.reduce((a, b) => a + b, 0) || 1;
  bar.querySelectorAll('.seg').forEach((seg, i) => {
    /** @type {HTMLElement} */ (seg).style.width = `${(100 * (parts[i] || 0)) / total}%`;
  });
}

export class Runtime {
  /** @param {any} state */
  constructor(state) {
    this.state = state;
    state.runtime = null;
    state.tiers = null;
    this.$ = (/** @type {string} */ id) => /** @type {HTMLElement} */ (document.getElementById(id));
  }

  async refresh() {
    const [rt, ex] = await Promise.all([getJSON('/v1/colibri/runtime'), getJSON('/v1/colibri/experts')]);
    this.state.runtime = rt;
    this.showEngine(rt);
    this.showMachine(rt.machine);
    this.showTiers(ex.tiers);
    this.showTurns(rt.turns);
    return ex;
  }

  /** @param {any} rt */
  showEngine(rt) {
    const e = rt.engine;
    fillList(this.$('engine'), [
      ['state', e.state ?? '–'], ['family', e.family ?? '–'], ['threads', `${e.threads ?? '–'}`],
      ['context', `${e.ctx ?? '–'}`], ['KV slots', `${e.kv_slots} (${e.kv_type})`],
      ['quant', `experts ${e.quant.experts ?? '–'}, dense ${e.quant.dense ?? '–'}`],
      ['RAM budget', e.ram_budget ? bytes(e.ram_budget) : 'all resident'],
      ['expert cache', e.cap ? `${e.cap} of ${e.experts} per layer` : '–'],
      ['kernels', e.kernels ?? '–'],
    ]);
  }

  /** @param {any} m */
  showMachine(m) {
    const gpu = m.gpus && m.gpus.length ? m.gpus.map((/** @type {any} */ g) => `${g.name} (${bytes(g.vram)})`).join(', ') : 'none';
    fillList(this.$('machine'), [
      ['CPU', m.cpu.model], ['cores', `${m.cpu.physical_cores} physical, ${m.cpu.logical} logical`],
      ['SIMD', m.cpu.simd], ['RAM', `${bytes(m.memory.available)} free of ${bytes(m.memory.total)}`],
      ['disk', `${bytes(m.disk.free)} free of ${bytes(m.disk.total)}`], ['GPU', gpu],
    ]);
  }

  /** @param {any} t the tier counts of /v1/colibri/experts */
  showTiers(t) {
    const pinned = t.pinned || 0, cached = Math.max(0, (t.cached || 0) - pinned), disk = t.disk || 0;
    this.state.tiers = { pinned: t.pinned, cached: t.cached, disk: t.disk, total: t.total };
    const bar = this.$('tierbar');
    Object.assign(bar.dataset, { pinned: `${t.pinned}`, cached: `${t.cached}`, disk: `${t.disk}`, total: `${t.total}` });
    setBar(bar, [pinned, cached, disk]);
    fillLegend(this.$('tierlegend'), [
      [cssVar('--pinned'), 'pinned', `${pinned}`], [cssVar('--cached'), 'cached', `${cached}`],
      [cssVar('--disk'), 'on disk', `${disk}`],
    ]);
  }

  /** @param {any[]} turns */
  showTurns(turns) {
    const last = turns[turns.length - 1];
    if (last) {
      const prefill = last.prefill_ms || 0, decode = last.decode_ms || 0;
      const wall = prefill + decode;
      const io = Math.min(last.io_wait_ms || 0, wall);
      const share = wall ? 1 - io / wall : 1;
      setBar(this.$('breakdown'), [prefill * share, decode * share, io]);
      fillLegend(this.$('breaklegend'), [
        [cssVar('--prefill'), 'prefill', `${num(prefill)} ms`], [cssVar('--decode'), 'decode', `${num(decode)} ms`],
        [cssVar('--io'), 'expert I/O wait', last.io_wait_ms === null ? 'n/a' : `${num(last.io_wait_ms, 1)} ms`],
        ['transparent', 'hit rate', last.hit_rate === null ? 'n/a' : `${num(100 * last.hit_rate)}%`],
        ...(last.draft_tokens ? [/** @type {[string, string, string]} */ (['transparent', 'drafts kept',
          `${last.draft_accepted} of ${last.draft_tokens} (${num(100 * last.draft_accepted / last.draft_tokens)}%)`])] : []),
      ]);
    }
    this.drawTrend(turns.map((t) => t.decode_tok_s).filter((v) => Number.isFinite(v)).slice(-60));
  }

  /** @param {number[]} values */
  drawTrend(values) {
    const c = /** @type {HTMLCanvasElement} */ (this.$('trend'));
    const dpr = window.devicePixelRatio || 1;
    const w = c.clientWidth || 280, h = c.clientHeight || 60;
    c.width = Math.round(w * dpr); c.height = Math.round(h * dpr);
    const g = /** @type {CanvasRenderingContext2D} */ (c.getContext('2d'));
    g.scale(dpr, dpr);
    g.clearRect(0, 0, w, h);
    if (!values.length) return;
    const max = Math.max(...values) * 1.1 || 1;
    g.strokeStyle = cssVar('--decode');
    g.lineWidth = 1.5;
    g.beginPath();
    values.forEach((v, i) => {
      const x = values.length > 1 ? (i / (values.length - 1)) * (w - 4) + 2 : w / 2;
      const y = h - 4 - (v / max) * (h - 16);
      if (i) g.lineTo(x, y); else g.moveTo(x, y);
    });
    g.stroke();
    g.fillStyle = cssVar('--dim');
    g.font = '11px system-ui, sans-serif';
    g.fillText(`${num(values[values.length - 1], 1)} tok/s (max ${num(Math.max(...values), 1)})`, 4, 11);
  }
}
