// Builds console/dist from console/src (`npm run build`): the script with what it uses of
// Apache ECharts bundled in, the style sheet, and the licences of what is bundled. The output
// is committed (the collector embeds it, so building Telemark needs no node); `.ci/run`
// builds it again and fails if it differs. Same esbuild, same sources: same bytes.
import { build } from "esbuild";
import { readFileSync, writeFileSync } from "node:fs";

await build({
  entryPoints: ["src/main.js"], bundle: true, format: "iife", target: "es2020", minify: true,
  legalComments: "linked", charset: "utf8", outfile: "dist/console.js", logLevel: "warning",
});
await build({ entryPoints: ["src/console.css"], bundle: true, minify: true, outfile: "dist/console.css", logLevel: "warning" });

// Apache-2.0 asks for the licence and NOTICE to go with the code.
const legal = ["dist/console.js.LEGAL.txt", "node_modules/echarts/NOTICE", "node_modules/echarts/LICENSE", "node_modules/zrender/LICENSE"]
  .map((f, i) => (i ? `\n=== ${f.replace("node_modules/", "")}\n\n` : "") + readFileSync(f, "utf8"));
writeFileSync("dist/console.js.LEGAL.txt", legal.join(""));
console.log("built dist/console.js, dist/console.css, dist/console.js.LEGAL.txt");
