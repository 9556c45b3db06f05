// Copy the panel's browser libraries from node_modules into static/vendor/ (committed: the panel
// works offline, no CDN). Run from this folder: `npm ci && npm run vendor`.
import { copyFileSync, mkdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const target = join(here, "..", "..", "static", "vendor", "uplot");
const source = join(here, "node_modules", "uplot");
mkdirSync(target, { recursive: true });
for (const [from, to] of [
  ["dist/uPlot.iife.min.js", "uPlot.iife.min.js"],
  ["dist/uPlot.min.css", "uPlot.min.css"],
  ["LICENSE", "LICENSE"],
  ["package.json", "package.json"],
]) {
  copyFileSync(join(source, from), join(target, to));
}
console.log(`uPlot copied to ${target}`);
