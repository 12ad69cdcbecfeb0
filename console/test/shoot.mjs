import { chromium } from "playwright-core";
const [base, out] = process.argv.slice(2);
const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"] });
const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
page.on("console", m => { if (m.type() === "error" || m.type() === "warning") console.log("console", m.type(), m.text()); });
page.on("pageerror", e => console.log("pageerror", e.message));
await page.route("**/console.js", r => r.fulfill({ path: "dist/console.js", contentType: "text/javascript" }));
await page.route("**/console.css", r => r.fulfill({ path: "dist/console.css", contentType: "text/css" }));
for (const v of ["overview", "path", "traffic", "int", "health"]) {
  const t0 = Date.now();
  await page.goto(`${base}/?view=${v}&range=15m`);
  await page.waitForSelector(`body[data-ready]`, { timeout: 20000 });
  console.log(v, Date.now() - t0, "ms", await page.evaluate(() => document.body.dataset.ready), await page.evaluate(() => (document.querySelector(".error") || {}).textContent));
  await page.screenshot({ path: `${out}/${v}.png`, fullPage: true });
}
await browser.close();
