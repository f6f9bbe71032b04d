// Small DOM and formatting helpers. Model text only ever reaches the page through textContent.

/** @param {string} tag @param {Record<string,string>} [attrs] @param {(Node|string)[]} [kids] */
export function el(tag, attrs = {}, kids = []) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') n.className = v; else n.setAttribute(k, v);
  }
  for (const k of kids) n.append(typeof k === 'string' ? document.createTextNode(k) : k);
  return n;
}

/** @param {number|null|undefined} n */
export function bytes(n) {
  if (n === null || n === undefined || !Number.isFinite(n)) return '–';
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return `${n.toFixed(i && n < 10 ? 1 : 0)} ${units[i]}`;
}

/** @param {number|null|undefined} n @param {number} [digits] */
export function num(n, digits = 0) {
  return n === null || n === undefined || !Number.isFinite(n) ? '–' : n.toFixed(digits);
}

/** Fills a <dl> with [term, value] rows. @param {HTMLElement} dl @param {[string, string][]} rows */
export function fillList(dl, rows) {
  dl.replaceChildren(...rows.flatMap(([k, v]) => [el('dt', {}, [k]), el('dd', {}, [v])]));
}

/** @param {HTMLElement} ul @param {[string, string, string][]} items  colour, label, value */
export function fillLegend(ul, items) {
  ul.replaceChildren(...items.map(([colour, label, value]) => {
    const dot = el('i');
    dot.style.background = colour;
    return el('li', {}, [dot, `${label} ${value}`]);
  }));
}

/** The CSS value of a custom property on :root. @param {string} name */
export function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}
