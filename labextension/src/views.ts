/**
 * The tabbed plan shell shared by the planner widget and the MIME renderer: a tab bar over views of one
 * plan document ("Memory", "Packing", then every view registered with `registerPlanView`, e.g. the
 * CD-graph view of graph.ts).  A view is drawn when its tab is first shown after the document changed,
 * so hidden plotly charts cost nothing and are never laid out at zero width.
 */
import { PlanChart, Region } from './chart';
import { PackingView } from './packing';
import { computeStep, PlanDoc } from './transforms';

/** One view of a plan document (a tab of the plan shell). */
export interface PlanView {
  readonly node: HTMLElement;
  update(doc: PlanDoc): void;
  dispose(): void;
  /** Called when the view's tab becomes visible or the shell is resized (plotly needs it). */
  resize?(): void;
  /**
   * Optional plan members this view draws that a sender may leave out until asked (the planner
   * widget sends the CD-graph only while the Graph tab is visible: `PlanTabs.onNeeds`).
   */
  readonly needs?: readonly string[];
}

/** What the shell offers to the views it hosts: links back into the memory chart. */
export interface PlanViewHost {
  /** The document currently shown, or null before the first update. */
  readonly doc: PlanDoc | null;
  /** Mark a planned schedule step on the memory chart (null clears the marker). */
  markStep(step: number | null): void;
  /** Mark the step that runs compute node `computeId` first and switch to the memory tab. */
  selectCompute(computeId: number): void;
  /** Shade x ranges (schedule steps) of the memory chart. */
  setRegions(regions: Region[]): void;
}

/** A registered extra view: its tab label and how to build it for one shell. */
export interface PlanViewSlot {
  label: string;
  create(host: PlanViewHost): PlanView;
}

const SLOTS: PlanViewSlot[] = [];

/** Add a tab to every plan shell created afterwards (a slot with the same label is replaced). */
export function registerPlanView(slot: PlanViewSlot): void {
  const index = SLOTS.findIndex(s => s.label === slot.label);
  if (index >= 0) {
    SLOTS[index] = slot;
  } else {
    SLOTS.push(slot);
  }
}

/** The registered extra views, in registration order. */
export function planViewSlots(): readonly PlanViewSlot[] {
  return SLOTS;
}

/** The memory-over-time chart as a view. */
export class MemoryView implements PlanView {
  readonly chart = new PlanChart();
  get node(): HTMLElement {
    return this.chart.node;
  }
  update(doc: PlanDoc): Promise<void> {
    return this.chart.draw(doc);
  }
  resize(): void {
    this.chart.resize();
  }
  dispose(): void {
    this.chart.dispose();
  }
}

interface Tab {
  label: string;
  view: PlanView;
  button: HTMLButtonElement;
  panel: HTMLDivElement;
  stale: boolean;
}

/** Tab bar plus one panel per view; `update` redraws the visible view and marks the others stale. */
export class PlanTabs implements PlanViewHost {
  readonly node: HTMLDivElement;
  readonly memory = new MemoryView();
  private readonly _bar: HTMLDivElement;
  private readonly _tabs: Tab[] = [];
  private _current = 0;
  private _doc: PlanDoc | null = null;
  /** Told the `needs` of the visible view whenever the visible tab changes (and when set). */
  private _onNeeds: ((needs: readonly string[]) => void) | null = null;

  constructor(slots: readonly PlanViewSlot[] = planViewSlots()) {
    this.node = document.createElement('div');
    this.node.className = 'jp-memviz-tabs';
    this._bar = document.createElement('div');
    this._bar.className = 'jp-memviz-tabbar';
    this._bar.setAttribute('role', 'tablist');
    this.node.append(this._bar);
    this._add('Memory', this.memory);
    this._add('Packing', new PackingView());
    for (const slot of slots) {
      try {
        this._add(slot.label, slot.create(this));
      } catch (err) {
        // A broken extra view must not take the memory chart down with it.
        console.error(`memviz: cannot create the "${slot.label}" view`, err);
      }
    }
    this.show(0);
  }

  get doc(): PlanDoc | null {
    return this._doc;
  }

  get labels(): string[] {
    return this._tabs.map(t => t.label);
  }

  /** The optional plan members the visible view draws. */
  get needs(): readonly string[] {
    return this._tabs[this._current]?.view.needs ?? [];
  }

  /** Call `listener` with `needs` now and whenever the visible tab changes. */
  onNeeds(listener: ((needs: readonly string[]) => void) | null): void {
    this._onNeeds = listener;
    listener?.(this.needs);
  }

  /** Show `doc`; resolves once the visible view has drawn (if it draws asynchronously). */
  async update(doc: PlanDoc): Promise<void> {
    this._doc = doc;
    for (const tab of this._tabs) {
      tab.stale = true;
    }
    await this._refresh();
  }

  /** Show the tab at `index` (or with that label). */
  show(which: number | string): void {
    const index = typeof which === 'number' ? which : this._tabs.findIndex(t => t.label === which);
    if (index < 0 || index >= this._tabs.length) {
      return;
    }
    this._current = index;
    this._tabs.forEach((tab, i) => {
      const active = i === index;
      tab.panel.hidden = !active;
      tab.button.classList.toggle('jp-mod-current', active);
      tab.button.setAttribute('aria-selected', String(active));
    });
    void this._refresh();
    this._tabs[index].view.resize?.();
    this._onNeeds?.(this.needs);
  }

  markStep(step: number | null): void {
    this.memory.chart.markStep(step);
  }

  selectCompute(computeId: number): void {
    if (!this._doc) {
      return;
    }
    this.markStep(computeStep(this._doc, computeId));
    this.show(0);
  }

  setRegions(regions: Region[]): void {
    this.memory.chart.setRegions(regions);
  }

  resize(): void {
    this._tabs[this._current]?.view.resize?.();
  }

  dispose(): void {
    for (const tab of this._tabs) {
      tab.view.dispose();
    }
    this._tabs.length = 0;
  }

  private _add(label: string, view: PlanView): void {
    const button = document.createElement('button');
    button.className = 'jp-memviz-tab';
    button.dataset.tab = label;
    button.setAttribute('role', 'tab');
    button.textContent = label;
    const panel = document.createElement('div');
    panel.className = 'jp-memviz-tabpanel';
    panel.dataset.tab = label;
    panel.append(view.node);
    const index = this._tabs.length;
    button.addEventListener('click', () => this.show(index));
    this._bar.append(button);
    this.node.append(panel);
    this._tabs.push({ label, view, button, panel, stale: true });
  }

  private async _refresh(): Promise<void> {
    const tab = this._tabs[this._current];
    if (this._doc && tab && tab.stale) {
      tab.stale = false;
      // Views may draw asynchronously (plotly); `update` is typed void so plain views stay simple.
      await (tab.view.update(this._doc) as void | Promise<void>);
    }
  }
}
