//! The collector's page: flows with loss, the chosen flow's loss over time per observation
//! point, and the newest INT events, drawn as SVG and tables from the JSON API (no external script, works offline). Plain modules of
//! code per panel, so it can grow into the dashboard.
//!
//! Everything a record brings (addresses, agent and point names, the verdict) is text: it is
//! escaped ([`SCRIPT`]'s `esc`) wherever it meets markup, and the page's content security
//! policy runs no script but `/page.js`. With a token file the page reads the API with the
//! reader token given after `#token=` in its address.

/// The page.
pub const HTML: &str = r##"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Telemark</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:10px 18px;display:flex;gap:18px;align-items:baseline}
header h1{font-size:18px;margin:0} header span{opacity:.75}
main{display:grid;grid-template-columns:minmax(320px,1fr) 2fr;gap:14px;padding:14px}
section{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:10px 12px}
h2{font-size:15px;margin:4px 0 10px} table{border-collapse:collapse;width:100%}
td,th{padding:3px 6px;text-align:left;border-bottom:1px solid #eef0f3;font-variant-numeric:tabular-nums}
tr.flow{cursor:pointer} tr.flow:hover,tr.sel{background:#eef4ff}
#chart svg{width:100%;height:320px} .legend span{margin-right:14px}
.muted{color:#6b7380} #verdict{font-weight:600;margin:8px 0} .wide{grid-column:1/-1}
</style></head><body>
<header><h1>Telemark</h1><span id="agents">agents: …</span><span id="updated"></span></header>
<main>
<section><h2>Flows with loss</h2><table><thead><tr><th>flow</th><th>lossy batches</th><th>lost</th></tr></thead>
<tbody id="flows"><tr><td colspan="3" class="muted">loading…</td></tr></tbody></table></section>
<section><h2 id="title">Loss over time</h2><div id="verdict" class="muted">choose a flow</div>
<div id="chart"></div><div class="legend" id="legend"></div></section>
<section class="wide"><h2>INT events</h2><table><thead><tr><th>time</th><th>agent</th><th>flow</th><th>detector</th><th>where</th><th>value</th></tr></thead>
<tbody id="events"><tr><td colspan="6" class="muted">loading…</td></tr></tbody></table></section>
</main>
<script src="/page.js"></script></body></html>
"##;

/// The page's script, served as `/page.js`.
pub const SCRIPT: &str = r##""use strict";
const COLORS=["#d1495b","#00798c","#edae49","#66a182","#2e4057","#8d96a3"];
let selected=null;
// A reader token, given as …/#token=… (the fragment never leaves the browser).
const TOKEN=new URLSearchParams(location.hash.slice(1)).get("token");
// Text from a record, for markup.
const esc=s=>String(s).replace(/[&<>"']/g,c=>({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"})[c]);
const fkey=f=>`${f.src}:${f.sport} → ${f.dst}:${f.dport} /${f.proto}`+(f.spi!=null?` spi ${f.spi} si ${f.si}`:"");
const fquery=f=>new URLSearchParams(Object.entries(f).filter(([k,v])=>v!=null)).toString();
async function getJSON(u){const r=await fetch(u,TOKEN?{headers:{Authorization:"Bearer "+TOKEN}}:{});if(!r.ok)throw new Error(u+": "+r.status);return r.json();}
async function agentsPanel(){
  const a=await getJSON("/api/v1/agents");
  document.getElementById("agents").textContent="agents: "+(a.length?a.map(x=>`${x.agent.agent} ${x.healthy?"✓":"✗ silent"}`).join(", "):"none yet");
}
async function flowsPanel(){
  const fl=await getJSON("/api/v1/flows?limit=50");const tb=document.getElementById("flows");tb.innerHTML="";
  if(!fl.length){tb.innerHTML='<tr><td colspan="3" class="muted">no loss reported</td></tr>';return;}
  for(const f of fl){const tr=document.createElement("tr");tr.className="flow"+(selected&&fkey(selected)===fkey(f.flow)?" sel":"");
    tr.innerHTML=`<td>${esc(fkey(f.flow))}</td><td>${esc(f.lossy_batches)}</td><td>${esc(f.lost)}</td>`;
    tr.onclick=()=>{selected=f.flow;refresh();};tb.appendChild(tr);}
  if(!selected)selected=fl[0].flow;
}
async function chartPanel(){
  if(!selected)return;
  document.getElementById("title").textContent="Loss over time: "+fkey(selected);
  const [s,loc]=await Promise.all([getJSON("/api/v1/loss?bucket_ns=1000000000&ints=string&"+fquery(selected)),getJSON("/api/v1/localise?"+fquery(selected))]);
  document.getElementById("verdict").textContent=loc.verdict?`${loc.lost} packets lost, ${loc.verdict.lost} of them ${loc.verdict.where}`:`${loc.lost} packets lost`;
  // Times come as strings (exact); to Number for drawing, where 256 ns do not matter.
  for(const p of s.series)p.t_ns=Number(p.t_ns);
  const series={};for(const p of s.series){(series[p.agent+" "+p.point]??=[]).push(p);}
  const pts=s.series;if(!pts.length){document.getElementById("chart").innerHTML="";return;}
  const t0=Math.min(...pts.map(p=>p.t_ns)),t1=Math.max(...pts.map(p=>p.t_ns))+1e9,ymax=Math.max(1,...pts.map(p=>p.lost));
  const W=800,H=300,L=48,B=28,x=t=>L+(t-t0)/(t1-t0)*(W-L-10),y=v=>H-B-v/ymax*(H-B-10);
  let g=`<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="lost packets per second">`;
  for(let i=0;i<=4;i++){const v=ymax*i/4;g+=`<line x1="${L}" x2="${W-10}" y1="${y(v)}" y2="${y(v)}" stroke="#eef0f3"/><text x="${L-6}" y="${y(v)+4}" text-anchor="end" font-size="11">${Math.round(v)}</text>`;}
  for(let i=0;i<=5;i++){const t=t0+(t1-t0)*i/5;g+=`<text x="${x(t)}" y="${H-8}" text-anchor="middle" font-size="11">${((t-t0)/1e9).toFixed(0)} s</text>`;}
  const leg=[];Object.entries(series).forEach(([name,ps],i)=>{const c=COLORS[i%COLORS.length];
    const bw=Math.max(2,(W-L)/((t1-t0)/1e9)/(Object.keys(series).length+1));
    for(const p of ps)g+=`<rect x="${x(p.t_ns)+i*bw}" y="${y(p.lost)}" width="${bw}" height="${H-B-y(p.lost)}" fill="${c}"><title>${esc(name)}: ${esc(p.lost)} lost of ${esc(p.expected)}</title></rect>`;
    leg.push(`<span style="color:${c}">■</span> ${esc(name)}`);});
  g+=`<text x="12" y="14" font-size="11">lost/s</text></svg>`;
  document.getElementById("chart").innerHTML=g;document.getElementById("legend").innerHTML=leg.join(" ");
}
async function eventsPanel(){
  const v=await getJSON("/api/v1/events?limit=20");const tb=document.getElementById("events");tb.innerHTML="";
  if(!v.events.length){tb.innerHTML='<tr><td colspan="6" class="muted">no INT events in the last hour</td></tr>';return;}
  for(const e of v.events){const tr=document.createElement("tr");
    const where=e.switch_id!=null?`switch ${e.switch_id} (hop ${e.hop})`:"path";
    const what=e.detector+(e.metric?" "+e.metric:"");
    tr.innerHTML=`<td>${esc(new Date(e.time_ns/1e6).toLocaleTimeString())}</td><td>${esc(e.agent)}</td><td>${esc(fkey(e.flow))}</td><td>${esc(what)}</td><td>${esc(where)}</td><td>${esc(e.value)}</td>`;
    tb.appendChild(tr);}
}
async function refresh(){
  try{await agentsPanel();await flowsPanel();await chartPanel();await eventsPanel();document.getElementById("updated").textContent="updated "+new Date().toLocaleTimeString();}
  catch(e){document.getElementById("updated").textContent="error: "+e.message;}
}
refresh();setInterval(refresh,2000);
"##;
