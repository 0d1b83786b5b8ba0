/* The parts of ECharts the page uses, bundled by build.mjs into static/echarts.min.js (self.echarts):
 * line and scatter series on a cartesian grid, the tooltip (and its axis pointer), data zoom (inside
 * and slider), the toolbox's drag-a-box zoom, mark lines, the canvas renderer. The whole ECharts
 * (dist/echarts.min.js, 1.1 MB) is three times the script to parse before the first chart. A chart
 * option naming a component not registered here is ignored by ECharts: add it to the list below.
 */
import { init, use } from "echarts/core";
import { LineChart, ScatterChart } from "echarts/charts";
import { DataZoomComponent, GridComponent, MarkLineComponent, ToolboxComponent, TooltipComponent } from "echarts/components";
import { CanvasRenderer } from "echarts/renderers";

use([LineChart, ScatterChart, GridComponent, TooltipComponent, DataZoomComponent, ToolboxComponent, MarkLineComponent, CanvasRenderer]);

self.echarts = { init };
