// Charts, drawn by Apache ECharts (from npm, bundled: nothing is fetched from elsewhere) with
// its SVG renderer, so a chart is part of the page's DOM. Only the parts used are bundled.
import * as echarts from "echarts/core";
import { BarChart, LineChart, HeatmapChart, SankeyChart } from "echarts/charts";
import { GridComponent, TooltipComponent, LegendComponent, VisualMapComponent, AriaComponent } from "echarts/components";
import { SVGRenderer } from "echarts/renderers";

echarts.use([BarChart, LineChart, HeatmapChart, SankeyChart, GridComponent, TooltipComponent, LegendComponent, VisualMapComponent, AriaComponent, SVGRenderer]);

// Colour-blind-safe (Okabe–Ito), then greys for "other".
export const COLORS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000", "#999999"];

// A chart in `el` with ECharts option `option`; `tz` "utc" draws time axes in UTC. `owner`
// holds the charts of one drawing of a view, disposed together when it is replaced.
export function chart(owner, el, option, tz, label) {
  el.setAttribute("role", "img");
  el.setAttribute("aria-label", label);
  const c = echarts.init(el, null, { renderer: "svg" });
  c.setOption({ useUTC: tz === "utc", animation: false, color: COLORS, aria: { enabled: true, label: { description: label } }, textStyle: { fontFamily: "system-ui, sans-serif" }, ...option });
  owner.add(c);
  return c;
}

// The charts in the page, resized with the window.
let shown = new Set();
addEventListener("resize", () => { for (const c of shown) c.resize(); });

// `owner`'s charts are now the page's: sized to where they are (drawn before their elements
// were in the page, they had no size), and the ones they replace disposed.
export function show(owner) {
  for (const c of shown) c.dispose();
  shown = owner;
  for (const c of shown) c.resize();
}

export function dispose(owner) {
  for (const c of owner) c.dispose();
}

// A time axis and a value axis with its unit, as every time chart has them: the unit is the
// axis's name, above it (never over the top value).
export function timeAxes(unit, fromMs, toMs) {
  return {
    grid: { left: 64, right: 64, top: 36, bottom: 84 },
    legend: { type: "scroll", bottom: 0, left: 16, right: 16 },
    xAxis: { type: "time", min: fromMs, max: toMs, name: "time", nameLocation: "middle", nameGap: 30 },
    yAxis: { type: "value", name: unit, nameLocation: "end", nameGap: 14, nameTextStyle: { align: "left" }, minInterval: 1 },
    tooltip: { trigger: "axis" },
  };
}
