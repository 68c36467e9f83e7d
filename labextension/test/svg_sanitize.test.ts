import { strict as assert } from 'node:assert';
import { test } from 'node:test';

import { allowedElement, sanitizeSvg, SVG_NS, SvgNode, unsafeAttribute } from '../src/svg_sanitize';

const XHTML_NS = 'http://www.w3.org/1999/xhtml';

/** A minimal element tree with the DOM's semantics for what the sanitiser uses (live lists). */
class FakeElement implements SvgNode {
  parent: FakeElement | null = null;
  readonly children: FakeElement[] = [];
  private attrs: { name: string; value: string }[];

  constructor(
    readonly localName: string,
    attrs: Record<string, string> = {},
    kids: FakeElement[] = [],
    readonly namespaceURI: string | null = SVG_NS
  ) {
    this.attrs = Object.entries(attrs).map(([name, value]) => ({ name, value }));
    for (const k of kids) {
      k.parent = this;
      this.children.push(k);
    }
  }

  get attributes(): { name: string; value: string }[] {
    return this.attrs;
  }

  removeAttribute(name: string): void {
    this.attrs = this.attrs.filter(a => a.name !== name);
  }

  remove(): void {
    if (this.parent) {
      this.parent.children.splice(this.parent.children.indexOf(this), 1);
      this.parent = null;
    }
  }

  /** every element below (and including) this one, depth first */
  all(): FakeElement[] {
    return [this, ...this.children.flatMap(c => c.all())];
  }

  attr(name: string): string | undefined {
    return this.attrs.find(a => a.name === name)?.value;
  }
}

const el = (name: string, attrs: Record<string, string> = {}, kids: FakeElement[] = []): FakeElement =>
  new FakeElement(name, attrs, kids);

/** What Graphviz writes for `digraph { n [URL="javascript:alert(1)", target="_blank"] }`, plus more. */
function hostileSvg(): FakeElement {
  return el('svg', { width: '62pt', viewBox: '0 0 62 116', xmlns: SVG_NS, onload: 'alert(1)' }, [
    el('g', { id: 'graph0', class: 'graph', transform: 'scale(1 1)', onclick: 'alert(2)' }, [
      el('title', {}, []),
      el('g', { id: 'c0', class: 'node', onmouseover: 'alert(3)', ONCLICK: 'alert(4)' }, [
        el('a', { 'xlink:href': 'javascript:alert(1)', 'xlink:title': 'n', target: '_blank' }, [
          el('polygon', { fill: '#c6e2ff', stroke: 'black', points: '0,0 1,1' }),
          el('text', { 'text-anchor': 'middle', x: '1', y: '2', 'font-family': 'Times,serif' })
        ]),
        el('a', { href: ' javascript:alert(5)' }, []),
        el('a', { href: '\u0001javascript:alert(6)' }, []),
        el('a', { href: 'data:image/svg+xml,<svg onload=alert(7)>' }, []),
        el('a', { 'xlink:href': '#c3' }, [])
      ]),
      el('image', { 'xlink:href': 'https://tracker.example/pixel.png' }),
      el('script', {}, []),
      el('foreignObject', {}, [new FakeElement('iframe', { src: 'javascript:alert(8)' }, [], XHTML_NS)]),
      el('animate', { attributeName: 'href', to: 'javascript:alert(9)' }),
      el('set', { attributeName: 'onclick', to: 'alert(10)' }),
      el('use', { href: 'https://evil.example/sprite.svg#x' }),
      el('style', {}, []),
      new FakeElement('script', {}, [], XHTML_NS),
      el('ellipse', {
        fill: 'url(https://evil.example/x)',
        stroke: 'url(#grad)',
        style: 'fill: url(//e.example)'
      }),
      el('path', { d: 'M0,0', style: 'stroke-width: 2' })
    ])
  ]);
}

test('javascript:, data: and remote links are removed; in-page fragments stay', () => {
  const svg = hostileSvg();
  sanitizeSvg(svg);
  const links = svg
    .all()
    .flatMap(e => e.attributes.filter(a => a.name === 'href' || a.name === 'xlink:href').map(a => a.value));
  assert.deepEqual(links, ['#c3']);
  assert.ok(svg.all().every(e => e.attr('target') === undefined));
});

test('no on* attribute survives, in any case', () => {
  const svg = hostileSvg();
  sanitizeSvg(svg);
  for (const e of svg.all()) {
    for (const a of e.attributes) {
      assert.ok(!a.name.toLowerCase().startsWith('on'), `${e.localName} keeps ${a.name}`);
    }
  }
});

test('only Graphviz drawing elements in the SVG namespace survive, with their geometry', () => {
  const svg = hostileSvg();
  const removed = sanitizeSvg(svg);
  assert.ok(removed > 10, String(removed));
  const names = new Set(svg.all().map(e => e.localName));
  for (const gone of ['script', 'foreignObject', 'iframe', 'image', 'animate', 'set', 'use', 'style']) {
    assert.ok(!names.has(gone), gone);
  }
  for (const kept of ['svg', 'g', 'title', 'a', 'polygon', 'text', 'ellipse', 'path']) {
    assert.ok(names.has(kept), kept);
  }
  const polygon = svg.all().find(e => e.localName === 'polygon')!;
  assert.deepEqual(
    polygon.attributes.map(a => a.name),
    ['fill', 'stroke', 'points']
  );
  const node = svg.all().find(e => e.attr('id') === 'c0')!;
  assert.equal(node.attr('class'), 'node'); // the click handler still maps it back to compute 0
  assert.equal(svg.attr('viewBox'), '0 0 62 116');
});

test('url() may only point into the document; style that fetches is dropped', () => {
  const svg = hostileSvg();
  sanitizeSvg(svg);
  const ellipse = svg.all().find(e => e.localName === 'ellipse')!;
  assert.equal(ellipse.attr('fill'), undefined);
  assert.equal(ellipse.attr('stroke'), 'url(#grad)');
  assert.equal(ellipse.attr('style'), undefined);
  assert.equal(
    svg
      .all()
      .find(e => e.localName === 'path')!
      .attr('style'),
    'stroke-width: 2'
  );
});

test('attribute rules on their own', () => {
  assert.equal(unsafeAttribute('onclick', 'x'), 'event handler');
  assert.equal(unsafeAttribute('onClick', 'x'), 'event handler');
  assert.equal(unsafeAttribute('xlink:href', 'JavaScript:alert(1)'), 'link out of the page');
  assert.equal(unsafeAttribute('href', '#d4'), null);
  assert.equal(unsafeAttribute('fill', "url('http://e.example/a')"), 'url() out of the page');
  assert.equal(unsafeAttribute('fill', 'url( #g )'), null);
  assert.equal(unsafeAttribute('style', 'background:url(#x)'), 'style that fetches or runs code');
  assert.equal(unsafeAttribute('style', 'x:expression(alert(1))'), 'style that fetches or runs code');
  assert.equal(unsafeAttribute('target', '_blank'), 'not an attribute Graphviz writes');
  assert.equal(unsafeAttribute('font-size', '14.00'), null);
});

test('elements outside the SVG namespace are refused even with an SVG name', () => {
  assert.equal(allowedElement({ localName: 'svg', namespaceURI: SVG_NS }), true);
  assert.equal(allowedElement({ localName: 'a', namespaceURI: XHTML_NS }), false);
  assert.equal(allowedElement({ localName: 'svg', namespaceURI: null }), false);
  assert.equal(allowedElement({ localName: 'Script', namespaceURI: SVG_NS }), false);
});
