// The part of plotly.js's API this extension calls (plotly.js-dist-min ships no type declarations).
declare module 'plotly.js-dist-min' {
  type Data = Record<string, unknown>;
  interface PlotlyStatic {
    react(root: HTMLElement, data: Data[], layout: Data, config?: Data): Promise<HTMLElement>;
    relayout(root: HTMLElement, update: Data): Promise<HTMLElement>;
    purge(root: HTMLElement): void;
    Plots: { resize(root: HTMLElement): Promise<void> };
  }
  const Plotly: PlotlyStatic;
  export default Plotly;
}
