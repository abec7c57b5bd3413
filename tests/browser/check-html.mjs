// Opens HTML reports in headless Chromium (puppeteer-core + @sparticuz/chromium) and prints one
// JSON line per page: console errors, page errors, failed requests, plots (inline SVG) and whether
// each is shown (laid out with a non-empty box, not hidden), and whether the page fits the window
// (no horizontal scrolling). Used by tests/it/browser.rs; nothing is judged here.
// Usage: node check-html.mjs MODULES_DIR WIDTH HEIGHT FILE.html...
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import path from 'node:path';

const [modules, width, height, ...files] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(modules), 'package.json'));
const chromium = require('@sparticuz/chromium');
const puppeteer = require('puppeteer-core');
const browser = await puppeteer.launch({
  args: chromium.args,
  executablePath: await chromium.executablePath(),
  headless: true,
  defaultViewport: { width: Number(width), height: Number(height) },
});
try {
  for (const file of files) {
    const page = await browser.newPage();
    const consoleErrors = [];
    const pageErrors = [];
    const failed = [];
    page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warn') consoleErrors.push(`${m.type()}: ${m.text()}`); });
    page.on('pageerror', (e) => pageErrors.push(String(e)));
    page.on('requestfailed', (r) => failed.push(r.url()));
    await page.goto(pathToFileURL(path.resolve(file)).href, { waitUntil: 'load' });
    const seen = await page.evaluate(() => {
      const plots = [...document.querySelectorAll('svg')].filter((s) => !s.parentElement.closest('svg'));
      const shown = plots.map((s) => {
        const r = s.getBoundingClientRect();
        const style = getComputedStyle(s);
        return r.width > 0 && r.height > 0 && style.display !== 'none' && style.visibility !== 'hidden';
      });
      const images = [...document.images].map((i) => i.complete && i.naturalWidth > 0);
      return {
        plots: plots.length,
        plots_shown: shown.filter(Boolean).length,
        images: images.length,
        images_shown: images.filter(Boolean).length,
        scroll_width: document.documentElement.scrollWidth,
        window_width: window.innerWidth,
      };
    });
    console.log(JSON.stringify({ file, console_errors: consoleErrors, page_errors: pageErrors, failed_requests: failed, ...seen }));
    await page.close();
  }
} finally {
  await browser.close();
}
