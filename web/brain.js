// The Brain: one cell per routed expert (rows: MoE layers, columns: experts). Colour = tier,
// brightness = routing heat (.coli_usage and this session), and each turn's experts flash and
// fade. One pixel per cell in an offscreen image scaled up, so 76 x 256 cells cost one
// drawImage per frame; frames are drawn only while something fades.
import { cssVar } from './util.js';

export const TIERS = ['on disk', 'cached', 'pinned', 'resident'];
const TIER_VARS = ['--disk', '--cached', '--pinned', '--resident'];
const FADE_S = 1.6;   // a flash falls to 1/e in this time

/** @param {string} hex @returns {number[]} */
function rgb(hex) {
  const m = hex.replace('#', '');
  return [0, 2, 4].map((i) => parseInt(m.slice(i, i + 2), 16) || 0);
}

/**
 * What the grid shows (window.coliState.brain): per cell, layer-major.
 * @typedef {{layers: number, experts: number, layerIndex: number[], cells: Uint8Array, usage: Float64Array|null,
 *   session: Float64Array, heat: Float32Array, flash: Float32Array, flashes: Uint32Array, lastTurn: number[][],
 *   frames: number, drawMs?: number, hover?: {layer: number, expert: number},
 *   centre: (l: number, e: number) => number[]}} BrainState
 */

export class Brain {
  /** @param {HTMLCanvasElement} canvas @param {HTMLElement} tip @param {any} state */
  constructor(canvas, tip, state) {
    this.canvas = canvas; this.tip = tip;
    /** @type {BrainState} */
    this.s = state.brain = {
      layers: 0, experts: 0, layerIndex: [], cells: new Uint8Array(0), usage: null, session: new Float64Array(0),
      heat: new Float32Array(0), flash: new Float32Array(0), flashes: new Uint32Array(0), lastTurn: [], frames: 0,
      centre: (/** @type {number} */ l, /** @type {number} */ e) => this.centre(l, e),
    };
    this.off = document.createElement('canvas');
    this.animating = false;
    this.last = 0;
    canvas.addEventListener('pointermove', (e) => this.hover(e));
    canvas.addEventListener('pointerdown', (e) => this.hover(e));
    canvas.addEventListener('pointerleave', () => { this.tip.hidden = true; });
    new ResizeObserver(() => this.draw()).observe(canvas);
  }

  /** The state of /v1/colibri/experts. @param {any} d */
  setExperts(d) {
    const s = this.s, n = d.layers * d.experts;
    if (s.layers !== d.layers || s.experts !== d.experts) {
      Object.assign(s, { layers: d.layers, experts: d.experts, flash: new Float32Array(n), flashes: new Uint32Array(n) });
      this.off.width = Math.max(1, d.experts); this.off.height = Math.max(1, d.layers);
    }
    s.layerIndex = d.layer_index;
    s.cells = Uint8Array.from(d.cells);
    s.usage = d.usage ? Float64Array.from(d.usage) : null;
    s.session = Float64Array.from(d.session);
    this.reheat();
    this.draw();
  }

  reheat() {
    const s = this.s, n = s.layers * s.experts;
    const heat = new Float32Array(n);
    const add = (/** @type {Float64Array|null} */ src, /** @type {number} */ w) => {
      if (!src) return;
      let max = 0;
      for (let i = 0; i < n; i++) max = Math.max(max, src[i]);
      if (!max) return;
      const lm = Math.log1p(max);
      for (let i = 0; i < n; i++) heat[i] += (w * Math.log1p(src[i])) / lm;
    };
    add(s.usage, s.usage ? 0.5 : 0);
    add(s.session, s.usage ? 0.5 : 1);
    s.heat = heat;
  }

  /** A turn event of /v1/colibri/events. @param {any} turn */
  onTurn(turn) {
    const s = this.s;
    if (!turn.routing || !s.experts) return;
    /** @type {number[][]} */
    const routed = [];
    turn.routing.forEach((/** @type {number[]} */ row, /** @type {number} */ layer) => {
      for (let j = 0; j + 1 < row.length; j += 2) {
        const i = layer * s.experts + row[j];
        s.flash[i] = 1; s.flashes[i] += 1; s.session[i] += row[j + 1];
        routed.push([layer, row[j], row[j + 1]]);
      }
    });
    s.lastTurn = routed;
    this.reheat();
    this.animate();
  }

  animate() {
    if (this.animating) return;
    this.animating = true;
    this.last = performance.now();
    const step = (/** @type {number} */ now) => {
      const k = Math.exp(-(now - this.last) / 1000 / FADE_S);
      this.last = now;
      let live = false;
      const f = this.s.flash;
      for (let i = 0; i < f.length; i++) {
        if (f[i] > 0.01) { f[i] *= k; live = true; } else f[i] = 0;
      }
      this.draw();
      if (live) requestAnimationFrame(step); else this.animating = false;
    };
    requestAnimationFrame(step);
  }

  draw() {
    const s = this.s, c = this.canvas;
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(1, Math.round(c.clientWidth * dpr)), h = Math.max(1, Math.round(c.clientHeight * dpr));
    if (c.width !== w || c.height !== h) { c.width = w; c.height = h; }
    const g = /** @type {CanvasRenderingContext2D} */ (c.getContext('2d'));
    g.clearRect(0, 0, w, h);
    if (!s.layers || !s.experts) return;
    const t0 = performance.now();
    s.frames += 1;
    const colours = TIER_VARS.map((v) => rgb(cssVar(v)));
    const o = /** @type {CanvasRenderingContext2D} */ (this.off.getContext('2d'));
    const img = o.createImageData(s.experts, s.layers);
    const px = img.data;
    for (let i = 0; i < s.layers * s.experts; i++) {
      const col = colours[s.cells[i]] || colours[0];
      const b = 0.4 + 0.6 * Math.min(1, s.heat[i] || 0), f = s.flash[i];
      for (let ch = 0; ch < 3; ch++) px[4 * i + ch] = col[ch] * b * (1 - f) + 255 * f;
      px[4 * i + 3] = 255;
    }
    o.putImageData(img, 0, 0);
    const box = this.box();
    g.imageSmoothingEnabled = false;
    g.drawImage(this.off, box.x, box.y, box.w, box.h);
    const cw = box.w / s.experts, ch = box.h / s.layers;
    if (cw >= 6 && ch >= 6) {  // big cells: draw the grid lines so each expert reads as a cell
      g.strokeStyle = cssVar('--bg');
      g.lineWidth = Math.max(1, dpr);
      g.beginPath();
      for (let x = 0; x <= s.experts; x++) { g.moveTo(box.x + x * cw, box.y); g.lineTo(box.x + x * cw, box.y + box.h); }
      for (let y = 0; y <= s.layers; y++) { g.moveTo(box.x, box.y + y * ch); g.lineTo(box.x + box.w, box.y + y * ch); }
      g.stroke();
    }
    s.drawMs = performance.now() - t0;  // the cost of one frame, for the scale test
  }

  /** Where the grid sits on the canvas (device pixels): cells at most 4:1 in aspect, 48 px at most. */
  box() {
    const s = this.s, W = this.canvas.width, H = this.canvas.height;
    const most = 48 * (window.devicePixelRatio || 1);  // a tiny model's cells stay cells, not slabs
    let cw = Math.min(W / s.experts, most), ch = Math.min(H / s.layers, most);
    ch = Math.min(ch, cw * 4); cw = Math.min(cw, ch * 4);
    return { x: (W - cw * s.experts) / 2, y: 0, w: cw * s.experts, h: ch * s.layers };
  }

  /** The page coordinates of a cell's centre. @param {number} layer @param {number} expert */
  centre(layer, expert) {
    const r = this.canvas.getBoundingClientRect(), k = (r.width || 1) / this.canvas.width, b = this.box();
    return [r.left + (b.x + (expert + 0.5) * (b.w / this.s.experts)) * k,
      r.top + (b.y + (layer + 0.5) * (b.h / this.s.layers)) * k];
  }

  /** @param {PointerEvent} e */
  hover(e) {
    const s = this.s;
    if (!s.layers) return;
    const r = this.canvas.getBoundingClientRect(), dpr = this.canvas.width / (r.width || 1);
    const b = this.box();
    const x = ((e.clientX - r.left) * dpr - b.x) / (b.w / s.experts), y = ((e.clientY - r.top) * dpr - b.y) / (b.h / s.layers);
    if (x < 0 || y < 0 || x >= s.experts || y >= s.layers) { this.tip.hidden = true; return; }
    const layer = Math.floor(y), expert = Math.floor(x), i = layer * s.experts + expert;
    const count = s.usage ? s.usage[i] : s.session[i];
    this.tip.textContent = `layer ${s.layerIndex[layer] ?? layer} · expert ${expert} · ${TIERS[s.cells[i]] || '?'}` +
      ` · heat ${(s.heat[i] || 0).toFixed(2)} · count ${count} (session ${s.session[i]})`;
    this.tip.hidden = false;
    const px = e.clientX - r.left, py = e.clientY - r.top;
    this.tip.style.left = `${Math.min(px + 12, Math.max(0, r.width - this.tip.offsetWidth))}px`;
    this.tip.style.top = `${py + 14}px`;
    s.hover = { layer, expert };
  }
}
