// Model output as HTML: Markdown (marked), sanitized (DOMPurify: model text is untrusted), code
// highlighted (highlight.js). All three are vendored in ../vendor (see its README for licences).
import { marked } from '../vendor/marked.esm.js';
import DOMPurify from '../vendor/purify.es.mjs';
import hljs from '../vendor/highlight.min.js';

marked.setOptions({ gfm: true, breaks: true });
hljs.configure({ ignoreUnescapedHTML: true });

export function render(el, text) {
  el.innerHTML = DOMPurify.sanitize(marked.parse(text || ''));
  for (const a of el.querySelectorAll('a')) { a.target = '_blank'; a.rel = 'noopener noreferrer'; }
  for (const code of el.querySelectorAll('pre code')) hljs.highlightElement(code);
}
