// A small Markdown subset rendered as DOM nodes built from text: fenced code blocks, bullet and
// numbered lists, headings, paragraphs, `code`, **bold**, *emphasis*. Nothing is ever parsed as
// HTML, so markup inside model output is shown as the characters it is.
import { el } from './util.js';

const INLINE = /(`[^`\n]+`)|(\*\*[^*\n]+\*\*)|(\*[^*\s\n][^*\n]*\*)|(_[^_\s\n][^_\n]*_)/g;

/** @param {string} text @returns {Node[]} */
export function inline(text) {
  const out = [];
  let at = 0;
  for (const m of text.matchAll(INLINE)) {
    const i = m.index ?? 0;
    if (i > at) out.push(document.createTextNode(text.slice(at, i)));
    const s = m[0];
    if (m[1]) out.push(el('code', {}, [s.slice(1, -1)]));
    else if (m[2]) out.push(el('strong', {}, [s.slice(2, -2)]));
    else out.push(el('em', {}, [s.slice(1, -1)]));
    at = i + s.length;
  }
  if (at < text.length) out.push(document.createTextNode(text.slice(at)));
  return out;
}

/** @param {string[]} lines @returns {Node[]} lines joined by <br> */
function withBreaks(lines) {
  return lines.flatMap((l, i) => (i ? [el('br'), ...inline(l)] : inline(l)));
}

/** @param {string} text @returns {DocumentFragment} */
export function render(text) {
  const frag = document.createDocumentFragment();
  const lines = text.split('\n');
  /** @type {string[]} */
  let para = [];
  /** @type {HTMLElement|null} */
  let list = null;
  const flush = () => {
    if (para.length) frag.append(el('p', {}, withBreaks(para)));
    para = [];
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*```(.*)$/);
    if (fence) {
      flush();
      const code = [];
      while (++i < lines.length && !/^\s*```\s*$/.test(lines[i])) code.push(lines[i]);
      const c = el('code', {}, [code.join('\n')]);
      if (fence[1].trim()) c.dataset.lang = fence[1].trim();
      frag.append(el('pre', {}, [c]));
      continue;
    }
    const item = line.match(/^\s*(?:([-*+])|(\d+)[.)])\s+(.*)$/);
    if (item) {
      const tag = item[1] ? 'ul' : 'ol';
      if (para.length) flush();
      if (!list || list.tagName.toLowerCase() !== tag) {
        list = el(tag);
        frag.append(list);
      }
      list.append(el('li', {}, inline(item[3])));
      continue;
    }
    const head = line.match(/^(#{1,6})\s+(.*)$/);
    if (head) {
      flush();
      frag.append(el('h4', {}, inline(head[2])));
      continue;
    }
    if (!line.trim()) { flush(); continue; }
    list = null;
    para.push(line);
  }
  flush();
  return frag;
}
