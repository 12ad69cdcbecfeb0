//! The collector's console (docs/console.md): one HTML document, and the script and style
//! sheet built from `console/` (`npm run build` there; `.ci/run` checks that the committed
//! `console/dist` is what its sources build to). Nothing is fetched from anywhere else: the
//! charts library (Apache ECharts, from npm) is inside the script, so the page works offline.
//!
//! Everything a record brings (addresses, agent and point names, the verdict) is text: the
//! console builds elements and sets their text, never markup from data, and the page's
//! content security policy runs no script but `/console.js`. With a token file the console
//! reads the API with the reader token given after `#token=` in its address.

/// The page.
pub const HTML: &str = r##"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Telemark</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/console.css"><link rel="icon" href="/favicon.svg">
</head><body>
<header id="top"><h1>Telemark</h1></header>
<div id="bar"></div>
<main id="view"><p class="muted">loading…</p></main>
<noscript>The console needs JavaScript; the JSON API (docs/collector.md) does not.</noscript>
<script src="/console.js"></script></body></html>
"##;

/// The console's script, served as `/console.js`.
pub const SCRIPT: &str = include_str!("../../../console/dist/console.js");

/// Its style sheet, served as `/console.css`.
pub const STYLE: &str = include_str!("../../../console/dist/console.css");

/// The licences of what the script bundles (Apache ECharts and zrender: Apache-2.0; tslib:
/// 0BSD), served as `/console.js.LEGAL.txt`, where the script's last line points.
pub const LEGAL: &str = include_str!("../../../console/dist/console.js.LEGAL.txt");

/// The tab's icon, served as `/favicon.svg` (a browser asks for one; a 404 is a console error).
pub const ICON: &str = "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 16 16\">\
    <rect width=\"16\" height=\"16\" rx=\"3\" fill=\"#1d2330\"/>\
    <path d=\"M3 11h3l2-6 2 6h3\" stroke=\"#56B4E9\" stroke-width=\"2\" fill=\"none\"/></svg>";
