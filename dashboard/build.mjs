// Build the page into ../gradmon/static/ (served by `gradmon serve`, also openable from disk).
// No bundler: the sources are classic scripts copied as they are, next to ECharts from node_modules.
// The output is laid out as the URLs are: index.html (served at /) and its assets in static/ (served at
// /static/<file>), so index.html's relative "static/<file>" URLs resolve over HTTP and from disk (file://)
// alike, and every asset exists once (the wheel ships this directory as it is).
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "gradmon", "static");
const echartsDir = join(here, "node_modules", "echarts");

if (!existsSync(join(echartsDir, "dist", "echarts.min.js"))) {
  console.error("echarts is not installed: run `npm ci` in dashboard/ first");
  process.exit(1);
}

const assets = join(out, "static");
rmSync(out, { recursive: true, force: true });
mkdirSync(assets, { recursive: true });

const copied = new Set();
function copy(from, name) {
  if (copied.has(name)) throw new Error(`two sources named ${name}: the assets directory is flat`);
  copied.add(name);
  copyFileSync(from, join(assets, name));
}
copy(join(here, "src", "style.css"), "style.css");
for (const dir of ["lib", "app"]) {
  for (const f of readdirSync(join(here, "src", dir)).filter((f) => f.endsWith(".js"))) copy(join(here, "src", dir, f), f);
}
copy(join(echartsDir, "dist", "echarts.min.js"), "echarts.min.js");
const version = JSON.parse(readFileSync(join(echartsDir, "package.json"), "utf8")).version;
const notice = existsSync(join(echartsDir, "NOTICE")) ? "\n\n" + readFileSync(join(echartsDir, "NOTICE"), "utf8") : "";
copied.add("echarts.LICENSE.txt");
writeFileSync(
  join(assets, "echarts.LICENSE.txt"),
  `ECharts ${version} (https://echarts.apache.org), Apache License 2.0\n\n` + readFileSync(join(echartsDir, "LICENSE"), "utf8") + notice,
);

// Every asset index.html references must exist (a missing one is a blank page, not a build error otherwise).
const html = readFileSync(join(here, "src", "index.html"), "utf8");
const refs = Array.from(html.matchAll(/(?:src|href)="static\/([^"]+)"/g), (m) => m[1]);
for (const f of refs) {
  if (!copied.has(f)) throw new Error(`index.html references static/${f}, which the build did not produce`);
}
if (/<script>/.test(html) || /\son\w+=/.test(html)) throw new Error("index.html must not contain inline scripts (CSP)");
// Written last: its time stamp is what `make dashboard` and setup.py compare with the sources.
copyFileSync(join(here, "src", "index.html"), join(out, "index.html"));
console.log(`built ${out} (echarts ${version}, index.html + ${copied.size} files in static/)`);
