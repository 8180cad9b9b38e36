"""The report as one self-contained HTML page drawn by plotly.js: the library (its cartesian bundle, vendored
in report/assets) and the figures travel inside the page gzip-compressed and the browser inflates them with
DecompressionStream, so the file opens offline by double click, stays small (about 1 MB) and draws in about
1.5 s (benchmarks/report_open.py)."""

from __future__ import annotations

import base64
import gzip
import html
import json
import math
from importlib import resources
from typing import Any

import numpy as np

from .figures import BarPlot, HeatmapPlot, Plot, Report, Section, Segments, Table, TimelinePlot, XYPlot

PLOTLY_VERSION = "4.1.1"  # plotly.js-cartesian-dist-min, see report/assets/README.md
ROW_PX = 18  # timeline row height
BAR_HALF_HEIGHT = 0.36  # a timeline bar spans row +- this (rows are 1 apart)
OVERLAY_HALF_HEIGHT = 0.09
TIMELINE_LEGEND_PER_LINE = 6
_CONFIG = {"responsive": True, "displaylogo": False, "scrollZoom": False,
           "toImageButtonOptions": {"format": "png", "scale": 2}}


def plotly_js_gz() -> bytes:
    """The vendored plotly.js bundle, gzip-compressed as shipped."""
    return resources.files("trainsim.report").joinpath("assets/plotly-cartesian.min.js.gz").read_bytes()


def _num(values: Any, digits: int) -> list[float | None]:  # noqa: ANN401 - a sequence of numbers
    """Rounded for a compact page; NaN becomes null (a gap in a line)."""
    return [None if (v is None or (isinstance(v, float) and math.isnan(v))) else round(float(v), digits)
            for v in values]


def _digits(span: float) -> int:
    """Decimals that keep about seven significant digits of the largest value (bars stay exact to the eye
    at any zoom Plotly allows)."""
    if span <= 0:
        return 6
    return max(0, 7 - int(math.floor(math.log10(span))) - 1)


def _bars_table(groups: list[Segments], digits: int, labels: dict[str, int]) -> dict[str, Any]:
    """Bars as parallel columns (row, start, end, group, label id): the page builds the drawn shapes and
    its hover from them (plotly's own hover would need one SVG element per bar, far too slow at 20k bars)."""
    rows = np.concatenate([g.row for g in groups]) if groups else np.zeros(0, dtype=np.int32)
    starts = np.concatenate([g.start_ms for g in groups]) if groups else np.zeros(0)
    ends = np.concatenate([g.end_ms for g in groups]) if groups else np.zeros(0)
    cat = np.concatenate([np.full(len(g), k, dtype=np.int32) for k, g in enumerate(groups)]) if groups else rows
    lab = [labels.setdefault(t, len(labels)) for g in groups for t in g.labels]
    return {"row": rows.astype(int).tolist(), "s": _num(starts, digits), "e": _num(ends, digits),
            "cat": cat.astype(int).tolist(), "lab": lab}


def _hline_shapes(hlines: list[tuple[float, str, str]], horizontal: bool = False
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Reference lines (a capacity, a target) as dashed shapes, each labelled by an annotation at its end."""
    shapes, notes = [], []
    for y, label, color in hlines:
        line = {"type": "line", "line": {"color": color, "width": 2, "dash": "dash"}}
        note = {"text": html.escape(label), "showarrow": False, "font": {"color": color, "size": 11}}
        if horizontal:
            shapes.append({**line, "xref": "x", "yref": "paper", "x0": y, "x1": y, "y0": 0, "y1": 1})
            notes.append({**note, "x": y, "xref": "x", "y": 1, "yref": "paper", "xanchor": "left", "yanchor": "top"})
        else:
            shapes.append({**line, "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": y, "y1": y})
            notes.append({**note, "x": 1, "xref": "paper", "y": y, "yref": "y", "xanchor": "right",
                          "yanchor": "bottom"})
    return shapes, notes


def _layout(title: str, height: int, **extra: Any) -> dict[str, Any]:  # noqa: ANN401
    return {"title": {"text": html.escape(title), "x": 0.01}, "height": height, "margin": {"l": 70, "r": 30,
            "t": 60, "b": 50}, "legend": {"orientation": "h", "y": -0.12}, "hovermode": "closest",
            "template": None, "plot_bgcolor": "#FFFFFF", "paper_bgcolor": "#FFFFFF", **extra}


def _timeline(p: TimelinePlot) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """No traces here: the page draws each group as one filled path from the bars table (see _BOOT)."""
    groups = [g for g in p.groups if len(g)]
    span = max((float(g.end_ms.max()) for g in groups), default=1.0)
    digits = _digits(span)
    labels: dict[str, int] = {}
    table: dict[str, Any] = {"cats": [{"name": g.name, "color": g.color} for g in groups],
                             "bars": _bars_table(groups, digits, labels), "h": BAR_HALF_HEIGHT,
                             "rows": len(p.rows), "span": span}
    if p.overlay is not None and len(p.overlay):
        table["overlay"] = {"name": p.overlay.name, "color": p.overlay.color, "h": OVERLAY_HALF_HEIGHT,
                            "bars": _bars_table([p.overlay], digits, labels)}
    table["labels"] = list(labels)
    n_legend = len(groups) + (p.overlay is not None and len(p.overlay) > 0)
    legend_px = 22 * math.ceil(n_legend / TIMELINE_LEGEND_PER_LINE)  # one line per few entries, under the title
    height = min(4000, 140 + legend_px + ROW_PX * len(p.rows))
    longest = max((len(r) for r in p.rows), default=10)
    layout = _layout(p.title, height,
                     xaxis={"title": {"text": p.x_label}, "showgrid": True, "gridcolor": "#EEE", "zeroline": False},
                     yaxis={"tickvals": list(range(len(p.rows))), "ticktext": [html.escape(r) for r in p.rows],
                            "range": [len(p.rows) - 0.5, -0.5], "showgrid": False, "zeroline": False,
                            "fixedrange": True, "tickfont": {"size": 10}},
                     legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0, "xanchor": "left"},
                     hovermode=False)
    layout["margin"]["l"] = min(400, 20 + 6 * longest)
    layout["margin"]["t"] = 50 + legend_px
    return [], layout, table


def _xy(p: XYPlot) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    data = []
    for s in p.series:
        trace: dict[str, Any] = {"type": "scatter", "mode": s.mode, "name": s.name, "x": _num(s.x, 6),
                                 "y": _num(s.y, 6), "line": {"shape": "hv" if s.step else "linear",
                                                             "dash": "dash" if s.dash else "solid"}}
        if s.color:
            trace["line"]["color"] = s.color
            trace["marker"] = {"color": s.color, "size": 7}
        if s.labels is not None:
            trace["text"] = s.labels
            trace["hovertemplate"] = "%{text}<br>x %{x:.4g}, y %{y:.4g}<extra>" + html.escape(s.name) + "</extra>"
        if s.fill_to_previous:
            trace["fill"] = "tonexty"
            trace["fillcolor"] = "rgba(84,162,75,0.12)"
        data.append(trace)
    layout = _layout(p.title, 460,
                     xaxis={"title": {"text": p.x_label}, "type": "log" if p.log_x else "linear",
                            "gridcolor": "#EEE"},
                     yaxis={"title": {"text": p.y_label}, "type": "log" if p.log_y else "linear",
                            "gridcolor": "#EEE", "rangemode": "tozero" if p.y_from_zero and not p.log_y else "normal"},
                     legend={"orientation": "v", "x": 1.01, "y": 1, "yanchor": "top"})
    layout["shapes"], layout["annotations"] = _hline_shapes(p.hlines)
    return data, layout


def _bar(p: BarPlot) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    data = []
    for name, values, color in p.stacks:
        cats = [html.escape(c) for c in p.categories]
        trace: dict[str, Any] = {"type": "bar", "name": name, "marker": {"color": color},
                                 "hovertemplate": "%{fullData.name}: %{value:.4g}<extra>%{label}</extra>"}
        if p.horizontal:
            trace.update(x=_num(values, 6), y=cats, orientation="h")
        else:
            trace.update(x=cats, y=_num(values, 6))
        data.append(trace)
    value_axis = {"title": {"text": p.value_label}, "gridcolor": "#EEE", "type": "log" if p.log_value else "linear"}
    cat_axis: dict[str, Any] = {"type": "category"}
    legend_px = 80 + 20 * len(p.stacks) if len(p.stacks) > 1 else 0  # the legend beside the bars, unclipped
    height = max(240, legend_px, 130 + 30 * len(p.categories) * (1 if p.stacked else len(p.stacks))) \
        if p.horizontal else max(440, legend_px)
    layout = _layout(p.title, min(height, 2000), barmode="stack" if p.stacked else "group",
                     xaxis=value_axis if p.horizontal else cat_axis,
                     yaxis={**cat_axis, "autorange": "reversed"} if p.horizontal else value_axis,
                     showlegend=len(p.stacks) > 1, legend={"orientation": "v", "x": 1.01, "y": 1, "yanchor": "top",
                                                           "traceorder": "normal"})
    layout["shapes"], layout["annotations"] = _hline_shapes(p.hlines, horizontal=p.horizontal)
    longest = max((len(c) for c in p.categories), default=4)
    if p.horizontal:  # room for the category names (set here: plotly's automargin draws every plot twice)
        layout["margin"]["l"] = min(420, 24 + 7 * longest)
    elif longest * 7 * len(p.categories) > 1100:  # long names under many bars are tilted
        layout["margin"]["b"] = min(260, 40 + int(5 * longest))
    return data, layout


def _heatmap(p: HeatmapPlot) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    small = len(p.x) * len(p.y) <= 225
    trace: dict[str, Any] = {"type": "heatmap", "x": [html.escape(x) for x in p.x],
                             "y": [html.escape(y) for y in p.y], "z": [_num(r, 6) for r in p.z],
                             "colorscale": "Viridis", "colorbar": {"title": {"text": p.z_label}},
                             "hoverongaps": False,
                             "hovertemplate": f"{html.escape(p.x_label)} %{{x}}<br>{html.escape(p.y_label)} %{{y}}"
                                              f"<br>{html.escape(p.z_label)} %{{z:.4g}}<extra></extra>"}
    if small:
        trace["texttemplate"] = "%{z:.3~s}"
    layout = _layout(p.title, max(360, 120 + 34 * len(p.y)),
                     xaxis={"title": {"text": p.x_label}, "type": "category"},
                     yaxis={"title": {"text": p.y_label}, "type": "category"})
    layout["margin"]["l"] = min(300, 60 + 7 * max((len(y) for y in p.y), default=4))
    return [trace], layout


def _figure(plot: Plot) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    if isinstance(plot, XYPlot):
        return (*_xy(plot), "xy")
    if isinstance(plot, BarPlot):
        return (*_bar(plot), "bar")
    if isinstance(plot, HeatmapPlot):
        return (*_heatmap(plot), "heatmap")
    raise TypeError(f"not a plot: {type(plot).__name__}")


def _table_html(t: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in t.rows)
    cap = f'<p class="ts-caption">{html.escape(t.caption)}</p>' if t.caption else ""
    return (f'<h3>{html.escape(t.title)}</h3><div class="ts-table-wrap"><table class="ts-table"><thead><tr>{head}'
            f"</tr></thead><tbody>{body}</tbody></table></div>{cap}")


def _section_html(sec: Section, index: int, figures: list[dict[str, Any]]) -> str:
    parts = [f'<section class="ts-section" data-kind="{html.escape(sec.kind)}"><h2>{html.escape(sec.title)}</h2>']
    if sec.source:
        parts.append(f'<p class="ts-source">from {html.escape(sec.source)}</p>')
    if sec.cards:
        parts.append('<div class="ts-cards">' + "".join(
            f'<div class="ts-card"><div class="ts-card-label">{html.escape(k)}</div>'
            f'<div class="ts-card-value">{html.escape(v)}</div></div>' for k, v in sec.cards) + "</div>")
    for note in sec.notes:
        parts.append(f'<p class="ts-note">{html.escape(note)}</p>')
    for item in sec.items:
        if isinstance(item, Table):
            parts.append(_table_html(item))
            continue
        pid = f"plot-{len(figures)}"
        if isinstance(item, TimelinePlot):
            data, layout, table = _timeline(item)
            kind = "timeline"
            figures.append({"id": pid, "data": data, "layout": layout, "config": _CONFIG, "timeline": table})
        else:
            data, layout, kind = _figure(item)
            figures.append({"id": pid, "data": data, "layout": layout, "config": _CONFIG})
        caption = item.caption + (" Drag across the plot to zoom in, double-click to zoom out; hover a bar for "
                                  "its name and times." if isinstance(item, TimelinePlot) else "")
        cap = f'<p class="ts-caption">{html.escape(caption.strip())}</p>' if caption.strip() else ""
        parts.append(f'<div class="ts-plot" id="{pid}" data-kind="{kind}"></div>{cap}')
    parts.append("</section>")
    return "".join(parts)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222;background:#FAFAFA}
main{max-width:1400px;margin:0 auto;padding:16px 24px}
h1{font-size:22px;margin:8px 0 4px} h2{font-size:19px;margin:28px 0 6px;border-bottom:1px solid #DDD}
h3{font-size:15px;margin:18px 0 6px}
.ts-meta,.ts-source{color:#666;font-size:13px;margin:2px 0}
.ts-cards{display:flex;flex-wrap:wrap;gap:10px;margin:10px 0}
.ts-card{background:#FFF;border:1px solid #E2E2E2;border-radius:6px;padding:8px 14px;min-width:120px}
.ts-card-label{font-size:12px;color:#666} .ts-card-value{font-size:18px;font-weight:600}
.ts-plot{background:#FFF;border:1px solid #E2E2E2;border-radius:6px;margin:12px 0 2px;min-height:120px}
.ts-caption,.ts-note{font-size:13px;color:#555;margin:2px 4px 14px}
.ts-note{background:#FFF8E1;border-left:3px solid #F2B705;padding:6px 10px}
.ts-table-wrap{max-height:480px;overflow:auto;border:1px solid #E2E2E2;border-radius:6px;background:#FFF}
.ts-table{border-collapse:collapse;font-size:12.5px;width:100%}
.ts-table th{position:sticky;top:0;background:#F2F2F2;text-align:left}
.ts-table td,.ts-table th{padding:3px 8px;border-bottom:1px solid #EEE;vertical-align:top}
.ts-error{background:#FDECEA;color:#8A1C10;padding:10px;border-radius:6px;white-space:pre-wrap}
#ts-loading{color:#666;font-size:13px}
.ts-tip{position:absolute;display:none;z-index:10;pointer-events:none;background:#FFF;border:1px solid #999;
border-radius:4px;padding:5px 8px;font-size:12px;box-shadow:0 2px 6px rgba(0,0,0,.15);max-width:520px}
"""

_BOOT = r"""
(function(){
  var fail=function(msg){
    var e=document.createElement('pre');e.className='ts-error';e.textContent='The report could not be drawn: '+msg;
    document.querySelector('main').prepend(e);document.body.dataset.ready='error';};
  window.addEventListener('error',function(ev){fail(ev.message);});
  var inflate=function(id){
    var bin=atob(document.getElementById(id).textContent.trim()),bytes=new Uint8Array(bin.length);
    for(var i=0;i<bin.length;i++){bytes[i]=bin.charCodeAt(i);}
    return new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'))).text();};
  // a timeline group as one filled path: each bar a rectangle, joined to the next along the bars' bottom
  // edges and walked back the same way, so the joins enclose no area (one SVG path however many bars)
  // a group's bars as filled rectangles, row by row: within a row the outline runs along the bars' bottom
  // edge from one bar to the next and the row's closing edge runs back along it, so the joins enclose no
  // area; rows are separate pieces of one trace (a gap between them), so a group is a handful of SVG paths.
  // A bar narrower than a pixel (minw ms) is drawn a pixel wide where the row is empty after it (an isolated
  // send stays visible; the parts of a fused task, side by side, keep their widths)
  var shapeXY=function(b,idx,h,minw){
    var n=idx.length,x=[],y=[],a,i,e,r,prev=null;
    for(a=0;a<n;a++){i=idx[a];r=b.row[i];
      if(prev!==null&&r!==prev){x.push(null);y.push(null);}prev=r;
      e=Math.max(b.e[i],Math.min(b.s[i]+minw,b.lim[i]));
      x.push(b.s[i],b.s[i],e,e);y.push(r+h,r-h,r-h,r+h);}
    return [x,y];};
  var limits=function(b){
    var rows=byRow(b);b.lim=new Array(b.row.length).fill(Infinity);
    Object.keys(rows).forEach(function(r){var l=rows[r];
      for(var k=0;k+1<l.length;k++){b.lim[l[k]]=Math.max(b.e[l[k]],b.s[l[k+1]]);}});};
  var groups=function(t){
    var by=t.cats.map(function(){return [];}),b=t.bars,i,out;
    limits(b);if(t.overlay){limits(t.overlay.bars);}
    for(i=0;i<b.row.length;i++){by[b.cat[i]].push(i);}
    var order=function(b){return function(p,q){return b.row[p]-b.row[q]||b.s[p]-b.s[q];};};
    out=t.cats.map(function(c,k){return {b:b,idx:by[k].sort(order(b)),h:t.h,name:c.name,color:c.color};});
    if(t.overlay){var o=t.overlay.bars,all=[];for(i=0;i<o.row.length;i++){all.push(i);}
      out.push({b:o,idx:all.sort(order(o)),h:t.overlay.h,name:t.overlay.name,color:t.overlay.color});}
    return out;};
  var timelineTraces=function(gs,minw){
    return gs.map(function(g){var xy=shapeXY(g.b,g.idx,g.h,minw);
      return {type:'scatter',mode:'lines',fill:'toself',fillcolor:g.color,name:g.name,x:xy[0],y:xy[1],
              hoverinfo:'skip',line:{width:0,color:g.color,simplify:false}};});};
  var rescale=function(gd,gs){
    var fl=gd._fullLayout,xa=fl&&fl.xaxis;if(!xa||!xa.range){return;}
    var minw=Math.abs(xa.range[1]-xa.range[0])/Math.max(100,fl._size.w),xs=[],ys=[];
    gs.forEach(function(g){var xy=shapeXY(g.b,g.idx,g.h,minw);xs.push(xy[0]);ys.push(xy[1]);});
    return Plotly.restyle(gd,{x:xs,y:ys});};
  var byRow=function(b){
    var rows={},i;for(i=0;i<b.row.length;i++){(rows[b.row[i]]=rows[b.row[i]]||[]).push(i);}
    Object.keys(rows).forEach(function(r){rows[r].sort(function(p,q){return b.s[p]-b.s[q];});});return rows;};
  var find=function(b,list,x,tol){
    if(!list){return -1;}var lo=0,hi=list.length-1,best=-1;
    while(lo<=hi){var m=(lo+hi)>>1;if(b.s[list[m]]<=x+tol){best=m;lo=m+1;}else{hi=m-1;}}
    for(var k=best;k>=0&&k>best-4;k--){var i=list[k];if(b.s[i]-tol<=x&&x<=b.e[i]+tol){return i;}}return -1;};
  var fmt=function(v){return v>=100?v.toFixed(1):v>=1?v.toFixed(3):v.toFixed(4);};
  // hover from the bars table: the pixel under the mouse -> row and time -> the bar there
  var hover=function(gd,t){
    var rows=byRow(t.bars),orows=t.overlay?byRow(t.overlay.bars):{},tip=document.createElement('div');
    tip.className='ts-tip';document.body.appendChild(tip);
    var hide=function(){tip.style.display='none';};
    gd.addEventListener('mouseleave',hide);
    gd.addEventListener('mousemove',function(ev){
      var fl=gd._fullLayout;if(!fl||!fl.xaxis||!fl.xaxis.p2c){return hide();}
      var r=gd.getBoundingClientRect(),sz=fl._size,px=ev.clientX-r.left-sz.l,py=ev.clientY-r.top-sz.t;
      if(px<0||py<0||px>sz.w||py>sz.h){return hide();}
      var x=fl.xaxis.p2c(px),y=fl.yaxis.p2c(py),row=Math.round(y);
      if(Math.abs(y-row)>t.h+0.05){return hide();}
      var tol=Math.abs(fl.xaxis.p2c(px+2)-x),i=find(t.bars,rows[row],x,tol);
      if(i<0){return hide();}
      var b=t.bars,s=b.s[i],e=b.e[i],crit=t.overlay&&find(t.overlay.bars,orows[row],x,0)>=0;
      tip.textContent='';
      [t.labels[b.lab[i]],t.cats[b.cat[i]].name+(crit?' · on the critical path':''),
       fmt(s)+' – '+fmt(e)+' ms ('+fmt(e-s)+' ms)'].forEach(function(line,k){
        var d=document.createElement('div');d.textContent=line;if(k===0){d.style.fontWeight='600';}tip.appendChild(d);});
      tip.style.display='block';tip.style.left=(ev.pageX+14)+'px';tip.style.top=(ev.pageY+12)+'px';});};
  if(typeof DecompressionStream==='undefined'){
    fail('this browser is too old (the report needs DecompressionStream: Chrome or Edge 80+, Firefox 113+, '+
         'Safari 16.4+)');return;}
  performance.mark('ts-start');
  Promise.all([inflate('ts-plotly'),inflate('ts-figures')]).then(function(parts){
    performance.mark('ts-inflated');
    // plotly.js from a blob: URL, so the browser compiles it as a script file (off the main thread)
    return new Promise(function(ok,no){
      var s=document.createElement('script'),url=URL.createObjectURL(new Blob([parts[0]],{type:'text/javascript'}));
      s.onload=function(){URL.revokeObjectURL(url);ok(parts[1]);};
      s.onerror=function(){no(new Error('plotly.js did not load'));};s.src=url;document.head.appendChild(s);});
  }).then(function(figText){
    performance.mark('ts-plotly-loaded');
    var figs=JSON.parse(figText),chain=Promise.resolve();
    figs.forEach(function(f){chain=chain.then(function(){
      var gd=document.getElementById(f.id),data=f.data,gs=null;
      if(f.timeline){
        gs=groups(f.timeline);
        var m=f.layout.margin,w=Math.max(100,gd.clientWidth-m.l-m.r);
        data=timelineTraces(gs,f.timeline.span/w);}
      return Plotly.newPlot(gd,data,f.layout,f.config).then(function(){
        if(gs){hover(gd,f.timeline);
          gd.on('plotly_relayout',function(ev){if(ev&&('xaxis.range[0]' in ev||'xaxis.autorange' in ev)){
            rescale(gd,gs);}});}
        performance.mark('ts-drawn-'+f.id);});});});
    return chain;
  }).then(function(){var l=document.getElementById('ts-loading');if(l){l.remove();}
    if(document.body.dataset.ready!=='error'){document.body.dataset.ready='1';}
  }).catch(function(err){fail(String(err&&err.message||err));});
})();
"""


def _blob(text: str) -> str:
    return base64.b64encode(gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0)).decode("ascii")


def render_html(report: Report, version: str) -> str:
    """The whole page as text (deterministic: the same report gives the same bytes)."""
    figures: list[dict[str, Any]] = []
    body = "".join(_section_html(s, i, figures) for i, s in enumerate(report.sections))
    fig_json = json.dumps(figures, separators=(",", ":"), allow_nan=False)
    toc = ""
    if len(report.sections) > 1:
        toc = '<p class="ts-meta">' + " · ".join(html.escape(s.title) for s in report.sections) + "</p>"
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(report.title)}</title>'
            f'<meta name="viewport" content="width=device-width,initial-scale=1"><style>{_CSS}</style></head>'
            f'<body><main><h1>{html.escape(report.title)}</h1><p class="ts-meta">trainsim {html.escape(version)} '
            f'· {len(figures)} plots · drawn by plotly.js {PLOTLY_VERSION} inside this file · works offline</p>{toc}<p id="ts-loading">drawing the plots…</p>{body}</main>'
            f'<script id="ts-plotly" type="application/octet-stream">{base64.b64encode(plotly_js_gz()).decode("ascii")}'
            "</script>"
            f'<script id="ts-figures" type="application/octet-stream">{_blob(fig_json)}</script>'
            f"<script>{_BOOT}</script></body></html>")
