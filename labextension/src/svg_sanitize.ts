/**
 * Allow-list sanitiser for the SVG Graphviz writes from a plan's DOT (graph.ts).
 *
 * The DOT travels in the plan document, and a document is untrusted: a notebook output (the MIME
 * renderer is registered safe, so it renders in untrusted notebooks too) or a report someone sent.
 * DOT attributes reach the SVG (`URL="javascript:..."` becomes `<a xlink:href="javascript:...">`,
 * `image=` an `<image>`), so only the elements and attributes Graphviz's own drawing uses survive:
 * no event handler, no link that leaves the page, no `url(...)` fetching something, no `<a>` target.
 *
 * Pure: it works on the small part of the DOM Element interface below, so it is unit-tested in node
 * without a browser.
 */

export const SVG_NS = 'http://www.w3.org/2000/svg';

/** What the sanitiser reads and changes of an element (a DOM Element satisfies it). */
export interface SvgNode {
  readonly localName: string;
  readonly namespaceURI: string | null;
  readonly attributes: ArrayLike<{ readonly name: string; readonly value: string }>;
  readonly children: ArrayLike<SvgNode>;
  removeAttribute(name: string): void;
  remove(): void;
}

/** The elements Graphviz's SVG renderer writes (XML names are case-sensitive). */
const ELEMENTS = new Set([
  'svg',
  'g',
  'a',
  'title',
  'desc',
  'path',
  'polygon',
  'polyline',
  'ellipse',
  'circle',
  'rect',
  'line',
  'text',
  'tspan',
  'defs',
  'linearGradient',
  'radialGradient',
  'stop'
]);

/** The presentation and geometry attributes those elements carry; every other one is dropped. */
const ATTRIBUTES = new Set([
  'id',
  'class',
  'transform',
  'viewBox',
  'preserveAspectRatio',
  'version',
  'xmlns',
  'xmlns:xlink',
  'width',
  'height',
  'x',
  'y',
  'x1',
  'y1',
  'x2',
  'y2',
  'cx',
  'cy',
  'r',
  'rx',
  'ry',
  'points',
  'd',
  'fill',
  'fill-opacity',
  'stroke',
  'stroke-width',
  'stroke-dasharray',
  'stroke-opacity',
  'stroke-linecap',
  'stroke-linejoin',
  'opacity',
  'font-family',
  'font-size',
  'font-weight',
  'font-style',
  'text-anchor',
  'text-decoration',
  'dominant-baseline',
  'baseline-shift',
  'offset',
  'stop-color',
  'stop-opacity',
  'gradientUnits',
  'gradientTransform',
  'style',
  'href',
  'xlink:href',
  'xlink:title'
]);

const LINKS = new Set(['href', 'xlink:href']);
/** `url(` not followed by `#`: a fetch (a gradient's `url(#id)` stays in the document). */
const REMOTE_URL = /url\s*\(\s*['"]?\s*[^#\s'"]/i;
/** style text that can fetch or run anything */
const UNSAFE_STYLE = /url\s*\(|expression\s*\(|javascript:|@import|\\/i;

/** Why attribute `name="value"` must go, or null when it may stay. */
export function unsafeAttribute(name: string, value: string): string | null {
  if (!ATTRIBUTES.has(name)) {
    return name.toLowerCase().startsWith('on') ? 'event handler' : 'not an attribute Graphviz writes';
  }
  // only in-page fragments: `javascript:`, `data:` and remote URLs are all refused, even with
  // leading blanks or control characters a browser would skip
  if (LINKS.has(name) && value.charAt(0) !== '#') {
    return 'link out of the page';
  }
  if (name === 'style' && UNSAFE_STYLE.test(value)) {
    return 'style that fetches or runs code';
  }
  if (REMOTE_URL.test(value)) {
    return 'url() out of the page';
  }
  return null;
}

/** Whether an element may stay (its attributes are checked separately). */
export function allowedElement(el: Pick<SvgNode, 'localName' | 'namespaceURI'>): boolean {
  return el.namespaceURI === SVG_NS && ELEMENTS.has(el.localName);
}

/**
 * Remove, in place, every element and attribute of `root` outside the allow-lists; returns how many
 * things were removed.  `root` itself must be an allowed `<svg>` element, else nothing should be shown
 * (the caller checks the return of `allowedElement` first).
 */
export function sanitizeSvg(root: SvgNode): number {
  let removed = 0;
  const stack: SvgNode[] = [root];
  while (stack.length > 0) {
    const el = stack.pop()!;
    // copy before removing: both lists are live in the DOM
    for (const attr of Array.from(el.attributes)) {
      if (unsafeAttribute(attr.name, attr.value) !== null) {
        el.removeAttribute(attr.name);
        removed++;
      }
    }
    for (const child of Array.from(el.children)) {
      if (allowedElement(child)) {
        stack.push(child);
      } else {
        child.remove();
        removed++;
      }
    }
  }
  return removed;
}
