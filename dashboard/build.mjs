// Build the page into ../gradmon/static/ (served by `gradmon serve`, also openable from disk).
// Three scripts, by esbuild (from the lockfile), in the order index.html loads them at the end of <body>:
// - static/early.js: src/boot/early.js bundled with the lib/ modules it requires: the page's first
//   requests, sent before the big scripts below are parsed (a few KiB).
// - static/echarts.min.js: src/vendor/echarts.js, the parts of ECharts the page uses (echarts/core
//   and the charts, components and renderer it registers, tree-shaken), not the whole dist build.
// - static/main.js: the page's own sources, classic scripts (each an IIFE sharing globals, so lib/
//   stays node-testable) joined in src/index.html's order into one script.
// GRADMON_PAGE_DEBUG=1 leaves all three unminified (main.js with a comment naming each source).
// The output is laid out as the URLs are: index.html (served at /) and its assets in static/ (served at
// /static/<file>), so index.html's relative "static/<file>" URLs resolve over HTTP and from disk (file://)
// alike, and every asset exists once (the wheel ships this directory as it is).
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { createHash } from "node:crypto";
import { buildSync, transformSync } from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "..", "gradmon", "static");
const echartsDir = join(here, "node_modules", "echarts");

if (!existsSync(join(echartsDir, "core.js"))) {
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
const debug = process.env.GRADMON_PAGE_DEBUG === "1";

/** Bundle one entry (ES module or CommonJS requires) into an IIFE script static/`name`; returns its size. */
function bundle(entry, name) {
  if (copied.has(name)) throw new Error(`two sources named ${name}: the assets directory is flat`);
  copied.add(name);
  const built = buildSync({
    entryPoints: [join(here, "src", entry)], outfile: join(assets, name), bundle: true, format: "iife",
    minify: !debug, target: "es2020", charset: "utf8", legalComments: "none", logLevel: "warning",
  });
  if (built.errors.length) throw new Error(`${entry}: ${built.errors.map((e) => e.text).join("; ")}`);
  return readFileSync(join(assets, name)).length;
}
const earlySize = bundle("boot/early.js", "early.js");
const echartsSize = bundle("vendor/echarts.js", "echarts.min.js");

// The page's own scripts, as src/index.html lists them (every source must be listed: one left out
// would be a feature silently missing from the page).
const sources = new Map();
for (const dir of ["lib", "app"]) {
  for (const f of readdirSync(join(here, "src", dir)).filter((f) => f.endsWith(".js"))) {
    if (sources.has(f)) throw new Error(`two sources named ${f}: src/lib and src/app share one namespace`);
    sources.set(f, join(here, "src", dir, f));
  }
}
const srcHtml = readFileSync(join(here, "src", "index.html"), "utf8");
const tags = Array.from(srcHtml.matchAll(/<script src="static\/([^"]+)"><\/script>\n?/g));
const bundled = tags.filter((m) => sources.has(m[1]));
const unlisted = [...sources.keys()].filter((f) => !bundled.some((m) => m[1] === f));
if (unlisted.length) throw new Error(`src/index.html does not load ${unlisted.join(", ")}`);
// Joined with ";" so that no script's last expression runs into the next one's opening parenthesis.
const joined = bundled.map((m) => `/* ${m[1]} */\n${readFileSync(sources.get(m[1]), "utf8")}\n;`).join("\n");
const main = debug ? joined : transformSync(joined, { minify: true, target: "es2020", charset: "utf8", legalComments: "none" }).code;
copied.add("main.js");
writeFileSync(join(assets, "main.js"), main);
let pageHtml = srcHtml;
for (const [i, m] of bundled.entries()) pageHtml = pageHtml.replace(m[0], i === 0 ? '<script src="static/main.js"></script>\n' : "");
const version = JSON.parse(readFileSync(join(echartsDir, "package.json"), "utf8")).version;
const notice = existsSync(join(echartsDir, "NOTICE")) ? "\n\n" + readFileSync(join(echartsDir, "NOTICE"), "utf8") : "";
copied.add("echarts.LICENSE.txt");
writeFileSync(
  join(assets, "echarts.LICENSE.txt"),
  `ECharts ${version} (https://echarts.apache.org), Apache License 2.0\n\n` + readFileSync(join(echartsDir, "LICENSE"), "utf8") + notice +
    bundledLicense("zrender", "LICENSE") + bundledLicense("tslib", "LICENSE.txt"),
);

/** The licence of a package bundled into echarts.min.js with ECharts (its own dependencies). */
function bundledLicense(pkg, file) {
  const dir = join(here, "node_modules", pkg);
  const v = JSON.parse(readFileSync(join(dir, "package.json"), "utf8")).version;
  return `\n\n---\n\n${pkg} ${v} (bundled with ECharts)\n\n` + readFileSync(join(dir, file), "utf8");
}

// What the page was built from, for a staleness check that does not need the sources copied
// (tests/page_browser.py computes the same): sha256 over each source's path below dashboard/ and bytes.
const digest = createHash("sha256");
// (every src/<dir>/*.js: lib/ and app/ joined, boot/ and vendor/ entries)
const scripts = readdirSync(join(here, "src"), { withFileTypes: true }).filter((d) => d.isDirectory())
  .flatMap((d) => readdirSync(join(here, "src", d.name)).filter((f) => f.endsWith(".js")).map((f) => `src/${d.name}/${f}`));
const srcFiles = ["build.mjs", "src/index.html", "src/style.css", ...scripts];
for (const rel of srcFiles.sort()) digest.update(rel + "\0").update(readFileSync(join(here, rel))).update("\0");
pageHtml = pageHtml.replace(/(<meta charset="utf-8">\n?)/, `$1<meta name="gradmon-sources" content="${digest.digest("hex")}">\n`);

// Every asset index.html references must exist (a missing one is a blank page, not a build error otherwise).
const html = pageHtml;
const refs = Array.from(html.matchAll(/(?:src|href)="static\/([^"]+)"/g), (m) => m[1]);
for (const f of refs) {
  if (!copied.has(f)) throw new Error(`index.html references static/${f}, which the build did not produce`);
}
if (/<script>/.test(html) || /\son\w+=/.test(html)) throw new Error("index.html must not contain inline scripts (CSP)");
// Written last: its time stamp is what `make dashboard` and setup.py compare with the sources.
writeFileSync(join(out, "index.html"), html);
const kib = (n) => `${(n / 1024).toFixed(0)} KiB`;
console.log(`built ${out} (echarts ${version}, index.html + ${copied.size} files in static/; early.js ${kib(earlySize)}, ` +
  `echarts.min.js ${kib(echartsSize)}, main.js: ${bundled.length} scripts, ${kib(main.length)}${debug ? ", unminified" : ""})`);
