// The Atlas: the experts placed in 3-D by co-activation (the server builds it from its recent
// turns, or serves the model's experts.json from tools/expert_atlas.py), drawn on a canvas with a
// simple perspective; drag rotates, the wheel or a pinch zooms. Before any turn with routing it
// says why it is empty and how to fill it.
import { getJSON } from './api.js';
import { cssVar } from './util.js';

export class Atlas {
  /** @param {HTMLCanvasElement} canvas @param {HTMLElement} note @param {HTMLElement} empty @param {any} state */
  constructor(canvas, note, empty, state) {
    this.canvas = canvas; this.note = note; this.empty = empty;
    /** @type {{points: number, yaw: number, pitch: number, zoom: number, loaded: boolean, error: string|null, source: string|null}} */
    this.s = state.atlas = { points: 0, yaw: 0.6, pitch: 0.35, zoom: 1, loaded: false, error: null, source: null };
    /** @type {number[][]} */
    this.pts = [];
    this.layers = 1;
    /** @type {Map<number, {x: number, y: number}>} */
    this.pointers = new Map();
    canvas.addEventListener('pointerdown', (e) => { canvas.setPointerCapture(e.pointerId); this.pointers.set(e.pointerId, e); });
    canvas.addEventListener('pointerup', (e) => this.pointers.delete(e.pointerId));
    canvas.addEventListener('pointercancel', (e) => this.pointers.delete(e.pointerId));
    canvas.addEventListener('pointermove', (e) => this.move(e));
    canvas.addEventListener('wheel', (e) => { e.preventDefault(); this.zoomBy(Math.exp(-e.deltaY / 500)); }, { passive: false });
    new ResizeObserver(() => this.draw()).observe(canvas);
  }

  async load() {
    try {
      const d = await getJSON('/v1/colibri/atlas');
      this.pts = d.points;
      this.layers = Math.max(1, d.layers);
      this.s.points = d.points.length; this.s.loaded = true; this.s.error = null;
      this.s.source = d.source || 'file';
      this.note.textContent = `${d.points.length} experts from ${d.turns} turns (${d.method})` +
        (d.source === 'live' ? ': built from this server\'s recent turns, it follows new ones' : '');
      this.empty.hidden = true;
    } catch (e) {
      this.s.error = String(/** @type {Error} */ (e).message || e);
      this.pts = []; this.s.points = 0; this.s.loaded = false;
      this.note.textContent = '';
      this.empty.textContent = this.s.error;
      this.empty.hidden = false;
    }
    this.draw();
  }

  /** @param {number} k */
  zoomBy(k) { this.s.zoom = Math.min(20, Math.max(0.2, this.s.zoom * k)); this.draw(); }

  /** @param {PointerEvent} e */
  move(e) {
    const prev = this.pointers.get(e.pointerId);
    if (!prev) return;
    if (this.pointers.size === 2) {
      const other = [...this.pointers.entries()].find(([id]) => id !== e.pointerId);
      if (other) {
        const o = other[1];
        const d0 = Math.hypot(prev.x - o.x, prev.y - o.y), d1 = Math.hypot(e.clientX - o.x, e.clientY - o.y);
        if (d0 > 0) this.zoomBy(d1 / d0);
      }
    } else {
      this.s.yaw += (e.clientX - prev.x) / 150;
      this.s.pitch = Math.max(-1.5, Math.min(1.5, this.s.pitch + (e.clientY - prev.y) / 150));
      this.draw();
    }
    this.pointers.set(e.pointerId, { x: e.clientX, y: e.clientY });
  }

  draw() {
    const c = this.canvas, dpr = window.devicePixelRatio || 1;
    const w = Math.max(1, Math.round(c.clientWidth * dpr)), h = Math.max(1, Math.round(c.clientHeight * dpr));
    if (c.width !== w || c.height !== h) { c.width = w; c.height = h; }
    const g = /** @type {CanvasRenderingContext2D} */ (c.getContext('2d'));
    g.clearRect(0, 0, w, h);
    if (!this.pts.length) return;
    const { yaw, pitch, zoom } = this.s;
    const cy = Math.cos(yaw), sy = Math.sin(yaw), cp = Math.cos(pitch), sp = Math.sin(pitch);
    const scale = (Math.min(w, h) / 2.6) * zoom;
    const maxCount = Math.max(1, ...this.pts.map((p) => p[5]));
    const proj = this.pts.map((p) => {
      const x = p[2] * cy - p[4] * sy, z0 = p[2] * sy + p[4] * cy;
      const y = p[3] * cp - z0 * sp, z = p[3] * sp + z0 * cp;
      const persp = 3 / (3 + z);
      return { sx: w / 2 + x * scale * persp, sy: h / 2 + y * scale * persp, z, p, persp };
    }).sort((a, b) => b.z - a.z);
    g.globalAlpha = 0.85;
    for (const q of proj) {
      const r = Math.max(1, (1.5 + 4 * Math.sqrt(q.p[5] / maxCount)) * dpr * q.persp);
      g.fillStyle = q.p[5] ? `hsl(${(q.p[0] / this.layers) * 300}, 70%, ${45 + 15 * q.persp}%)` : cssVar('--disk');
      g.beginPath();
      g.arc(q.sx, q.sy, r, 0, 2 * Math.PI);
      g.fill();
    }
    g.globalAlpha = 1;
  }
}
