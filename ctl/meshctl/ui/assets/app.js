// SPDX-License-Identifier: Apache-2.0
// meshctl ui: the live map, drawn by hand as SVG (no library, nothing from the network but this
// page's own server). It polls /api/graph (the graph model of mesh/graph.py with what the agents
// see now) and redraws: clusters and locations as boxes, a location's nodes inside it once it is
// opened, each pair's line coloured by the rung in use now, dashed when the pair fell back from
// its ladder's first rung, red when no path joins it. A closed location stands for its nodes: the
// pairs it holds are counted on one line per pair of boxes, so 500 nodes draw a few dozen lines.
"use strict";

const NS = "http://www.w3.org/2000/svg";
// Rungs in order of cost (mesh/model.py RUNGS, then relay); the costliest of an edge's pairs
// decides nothing but the order counts are listed in.
const RUNG_ORDER = ["direct", "direct+ipip", "direct+vxlan", "wireguard-private", "tunnel", "relay"];
const SIZE = { nodeW: 116, nodeH: 32, gap: 12, locW: 200, locH: 86, head: 44, boxGap: 80, pad: 28 };
const MAX_LABELS = 40; // edges labelled with their counts when no more than this many are drawn
const MAX_PANEL_PAIRS = 300;
const RING_UP_TO = 16; // an open location of up to this many nodes lays them on a ring, more in a grid

const state = {
  meta: null, doc: null, etag: null, expanded: null, selected: null, found: null,
  layout: null, view: null, lastOk: 0, polling: false, fitNext: true,
};

// --- small helpers -----------------------------------------------------------------------------

function el(tag, attrs, parent, text) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) e.setAttribute(k, String(v));
  }
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}

function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "onclick") e.addEventListener("click", v);
    else if (v !== null && v !== undefined && v !== false) e.setAttribute(k, String(v));
  }
  for (const k of kids) {
    if (k === null || k === undefined) continue;
    e.appendChild(typeof k === "string" || typeof k === "number" ? document.createTextNode(String(k)) : k);
  }
  return e;
}

function colour(rung) {
  if (rung === null || rung === undefined) return state.meta.no_path;
  return state.meta.colours[rung] || "#9e9e9e";
}

function chip(rung, fellBack, unseen) {
  const c = h("span", { class: "chip" + (fellBack ? " dashed" : "") + (unseen ? " unseen" : "") },
    rung === null ? "no path" : rung);
  c.setAttribute("data-colour", colour(rung));
  c.style.background = colour(rung); // CSSOM: allowed by the page's CSP, unlike a style attribute
  return c;
}

function short(name, n) { return name.length > n ? name.slice(0, n - 1) + "\u2026" : name; }

function fmtMs(v) { return v === null || v === undefined ? "-" : v.toFixed(2) + " ms"; }
function fmtLoss(v) { return v === null || v === undefined ? "-" : Math.round(v * 100) + " %"; }
function fmtAge(v) { return v === null || v === undefined ? "-" : Math.round(v) + " s"; }

async function getJSON(url) {
  const r = await fetch(url, { cache: "no-store" });
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

// --- the model, as the map needs it ------------------------------------------------------------

function index(model) {
  const nodeLoc = new Map();
  const locs = new Map();
  for (const l of model.locations) {
    const key = l.cluster + "/" + l.name;
    locs.set(key, { key, ...l });
    for (const n of l.nodes) nodeLoc.set(n, key);
  }
  if (model.peers.length) {
    const names = model.peers.map((p) => "peer:" + p.name);
    locs.set("peers", { key: "peers", cluster: model.cluster, name: "peers", nodes: names, leaders: [], subnets: [],
      peers: true });
    for (const n of names) nodeLoc.set(n, "peers");
  }
  const nodes = new Map(model.nodes.map((n) => [n.name, n]));
  return { nodeLoc, locs, nodes };
}

// Where each box goes: clusters stacked, each cluster's locations in rows (shelf packing) no
// wider than a width that keeps the whole roughly as wide as a screen.
function layout(model, idx, expanded) {
  const boxes = new Map(); // loc key -> {x, y, w, h, cols}
  const nodePos = new Map(); // node -> {x, y} (centre), for nodes of open locations
  const clusters = [];
  let area = 0;
  const sizes = new Map();
  for (const l of idx.locs.values()) {
    let w = SIZE.locW, hgt = SIZE.locH, cols = 0;
    let ring = null;
    if (expanded.has(l.key)) {
      const k = l.nodes.length;
      if (k === 2) {
        // side by side, far enough apart for their line to show
        ring = { a: SIZE.nodeW / 2 + 40, b: 0, start: Math.PI };
        w = Math.max(SIZE.locW, 2 * ring.a + SIZE.nodeW + 2 * SIZE.gap);
        hgt = SIZE.head + SIZE.nodeH + 2 * SIZE.gap;
      } else if (k >= 3 && k <= RING_UP_TO) {
        // a ring: the lines between its nodes are chords that pass no other node
        ring = { a: Math.max(SIZE.nodeW, k * 27), b: Math.max(SIZE.nodeH * 1.5, k * 13), start: -Math.PI / 2 };
        w = Math.max(SIZE.locW, 2 * ring.a + SIZE.nodeW + 2 * SIZE.gap);
        hgt = SIZE.head + 2 * ring.b + SIZE.nodeH + 2 * SIZE.gap;
      } else {
        cols = Math.max(1, Math.min(8, Math.ceil(Math.sqrt(k * 2))));
        const rows = Math.ceil(k / cols);
        w = Math.max(SIZE.locW, cols * (SIZE.nodeW + SIZE.gap) + SIZE.gap);
        hgt = SIZE.head + rows * (SIZE.nodeH + SIZE.gap) + SIZE.gap;
      }
    }
    sizes.set(l.key, { w, h: hgt, cols, ring });
    area += (w + SIZE.boxGap) * (hgt + SIZE.boxGap);
  }
  const maxW = Math.max(900, Math.sqrt(area) * 1.5);
  let y = 0;
  const order = [...model.clusters];
  for (const l of idx.locs.values()) if (!order.includes(l.cluster)) order.push(l.cluster);
  for (const c of order) {
    const mine = [...idx.locs.values()].filter((l) => l.cluster === c);
    if (!mine.length) continue;
    let x = SIZE.pad, rowH = 0, top = y + SIZE.pad + 18, cy = top, right = 0;
    for (const l of mine) {
      const s = sizes.get(l.key);
      if (x > SIZE.pad && x + s.w > maxW) { x = SIZE.pad; cy += rowH + SIZE.boxGap; rowH = 0; }
      boxes.set(l.key, { x, y: cy, w: s.w, h: s.h, cols: s.cols });
      if (s.ring) {
        const ox = x + s.w / 2, oy = cy + SIZE.head + SIZE.gap + SIZE.nodeH / 2 + s.ring.b;
        l.nodes.forEach((n, i) => {
          const t = s.ring.start + i * 2 * Math.PI / l.nodes.length;
          nodePos.set(n, { x: ox + s.ring.a * Math.cos(t), y: oy + s.ring.b * Math.sin(t) });
        });
      } else if (s.cols) {
        l.nodes.forEach((n, i) => {
          const col = i % s.cols, row = Math.floor(i / s.cols);
          nodePos.set(n, { x: x + SIZE.gap + col * (SIZE.nodeW + SIZE.gap) + SIZE.nodeW / 2,
            y: cy + SIZE.head + row * (SIZE.nodeH + SIZE.gap) + SIZE.nodeH / 2 });
        });
      }
      x += s.w + SIZE.boxGap;
      right = Math.max(right, x - SIZE.boxGap);
      rowH = Math.max(rowH, s.h);
    }
    const bottom = cy + rowH + SIZE.pad;
    clusters.push({ name: c, x: 0, y, w: right + SIZE.pad, h: bottom - y });
    y = bottom + SIZE.boxGap / 2;
  }
  const width = Math.max(...clusters.map((c) => c.w), 300);
  return { boxes, nodePos, clusters, width, height: Math.max(y, 200) };
}

// An end of a pair as drawn: the node when its location is open, else its location's box.
function endOf(name, idx, expanded) {
  const loc = idx.nodeLoc.get(name);
  if (loc === undefined) return null;
  return expanded.has(loc) ? "n:" + name : "l:" + loc;
}

function rungKey(p) { return p.rung === null ? "none" : p.rung; }

// The lines to draw: one per pair of open nodes, one per pair of boxes (or box and node) with
// the pairs it stands for; and per closed location, the pairs inside it.
function edges(model, idx, expanded) {
  const lines = new Map();
  const inside = new Map();
  for (const p of model.pairs) {
    const a = endOf(p.a, idx, expanded), b = endOf(p.b, idx, expanded);
    if (a === null || b === null) continue;
    if (a === b) {
      const s = inside.get(a) || { pairs: 0, counts: {}, none: 0, fell: 0 };
      s.pairs++; s.counts[rungKey(p)] = (s.counts[rungKey(p)] || 0) + 1;
      if (p.rung === null) s.none++;
      if (p.fell_back) s.fell++;
      inside.set(a, s);
      continue;
    }
    const [x, y] = a < b ? [a, b] : [b, a];
    const key = x + "|" + y;
    let e = lines.get(key);
    if (!e) { e = { key, a: x, b: y, pairs: [], counts: {}, none: 0, fell: 0, unseen: 0 }; lines.set(key, e); }
    e.pairs.push(p);
    e.counts[rungKey(p)] = (e.counts[rungKey(p)] || 0) + 1;
    if (p.rung === null) e.none++;
    if (p.fell_back) e.fell++;
    if (model.live && !p.seen) e.unseen++;
  }
  for (const e of lines.values()) {
    // red when a pair has no path; else the rung most of its pairs take
    let best = null, n = -1;
    for (const r of RUNG_ORDER) if ((e.counts[r] || 0) > n) { best = r; n = e.counts[r] || 0; }
    for (const r of Object.keys(e.counts)) if (r !== "none" && e.counts[r] > n) { best = r; n = e.counts[r]; }
    e.rung = e.none ? null : best;
  }
  return { lines, inside };
}

function countsText(counts) {
  const keys = [...RUNG_ORDER.filter((r) => counts[r]), ...Object.keys(counts).filter((r) => !RUNG_ORDER.includes(r))];
  return keys.map((r) => counts[r] + " " + (r === "none" ? "no path" : r)).join(", ");
}

// --- drawing -------------------------------------------------------------------------------------

// The rectangle an end is drawn as: a node's, or its location's box (centre and half sizes).
function shape(end, lay) {
  if (end.startsWith("n:")) {
    const p = lay.nodePos.get(end.slice(2));
    return p && { x: p.x, y: p.y, hw: SIZE.nodeW / 2, hh: SIZE.nodeH / 2 };
  }
  const b = lay.boxes.get(end.slice(2));
  return b && { x: b.x + b.w / 2, y: b.y + b.h / 2, hw: b.w / 2, hh: b.h / 2 };
}

// Where the line from a shape's centre towards (tx, ty) leaves the shape.
function border(s, tx, ty) {
  const dx = tx - s.x, dy = ty - s.y;
  const t = Math.min(dx ? s.hw / Math.abs(dx) : Infinity, dy ? s.hh / Math.abs(dy) : Infinity, 1);
  return { x: s.x + dx * t, y: s.y + dy * t };
}

// A line between two shapes, bent a little off the straight one (so it goes round the boxes
// between two boxes of one row) and cut at their borders: its path and its middle.
function curve(a, b, straight) {
  const dx = b.x - a.x, dy = b.y - a.y, len = Math.hypot(dx, dy) || 1;
  const bend = straight ? 0 : Math.min(0.18 * len, 90);
  const cx = (a.x + b.x) / 2 - dy / len * bend, cy = (a.y + b.y) / 2 + dx / len * bend;
  const p = border(a, cx, cy), q = border(b, cx, cy);
  const mid = { x: 0.25 * p.x + 0.5 * cx + 0.25 * q.x, y: 0.25 * p.y + 0.5 * cy + 0.25 * q.y };
  return { d: `M${p.x.toFixed(1)} ${p.y.toFixed(1)} Q${cx.toFixed(1)} ${cy.toFixed(1)} ${q.x.toFixed(1)} ${q.y.toFixed(1)}`, mid };
}

function draw() {
  const svg = document.getElementById("map");
  const model = state.doc.model;
  const idx = index(model);
  if (state.expanded === null) {
    state.expanded = new Set(model.nodes.length <= state.meta.expand_up_to ? [...idx.locs.keys()] : ["peers"]);
  }
  const lay = layout(model, idx, state.expanded);
  const { lines, inside } = edges(model, idx, state.expanded);
  state.layout = { lay, idx, lines };
  svg.replaceChildren();
  const gClusters = el("g", { class: "clusters" }, svg);
  const gLocs = el("g", { class: "locs" }, svg);
  const gEdges = el("g", { class: "edges" }, svg);
  const gNodes = el("g", { class: "nodes" }, svg);
  for (const c of lay.clusters) {
    const g = el("g", { class: "cluster", "data-cluster": c.name }, gClusters);
    el("rect", { x: c.x + 4, y: c.y + 4, width: c.w - 8, height: c.h - 8, rx: 10 }, g);
    el("text", { x: c.x + 16, y: c.y + 26 }, g, "cluster " + c.name);
  }
  const sel = state.selected;
  for (const l of idx.locs.values()) {
    const b = lay.boxes.get(l.key);
    const open = state.expanded.has(l.key);
    const stats = inside.get("l:" + l.key);
    const cls = "loc" + (open ? "" : " collapsed") + (stats && stats.none ? " broken" : "") +
      (sel && sel.kind === "loc" && sel.key === l.key ? " selected" : "");
    const g = el("g", { class: cls, "data-loc": l.key }, gLocs);
    el("rect", { class: "box", x: b.x, y: b.y, width: b.w, height: b.h, rx: 6 }, g);
    const head = el("rect", { class: "head", x: b.x, y: b.y, width: b.w, height: open ? 30 : 26, rx: 6 }, g);
    head.addEventListener("click", (ev) => { ev.stopPropagation(); toggle(l.key); });
    const title = (l.peers ? "peers" : (l.name || "(no location)")) + " \u00b7 " + l.nodes.length +
      (l.peers ? " peer" : " node") + (l.nodes.length === 1 ? "" : "s");
    el("text", { class: "title", x: b.x + 10, y: b.y + 18 }, g, short(title, 30));
    el("text", { class: "small", x: b.x + b.w - 10, y: b.y + 18, "text-anchor": "end" }, g, open ? "\u2212" : "+");
    if (!open) {
      g.addEventListener("click", () => toggle(l.key));
      const lead = l.leaders.length ? "leader " + l.leaders.join(", ") : (l.subnets.join(", ") || "");
      el("text", { class: "small", x: b.x + 10, y: b.y + 44 }, g, short(lead, 32));
      el("text", { class: "small", x: b.x + 10, y: b.y + 60 }, g, short(l.leaders.length ? l.subnets.join(", ") : "", 32));
      if (stats) {
        el("text", { class: "small", x: b.x + 10, y: b.y + 76 }, g,
          short("inside: " + countsText(stats.counts) + (stats.fell ? ", " + stats.fell + " fell back" : ""), 34));
      }
      const t = el("title", {}, g);
      t.textContent = title + (stats ? "\ninside: " + countsText(stats.counts) : "") + "\nclick to open";
    }
  }
  const labelled = lines.size <= MAX_LABELS;
  for (const e of lines.values()) {
    const sa = shape(e.a, lay), sb = shape(e.b, lay);
    if (!sa || !sb) continue;
    const sameLoc = e.a.startsWith("n:") && e.b.startsWith("n:") &&
      idx.nodeLoc.get(e.a.slice(2)) === idx.nodeLoc.get(e.b.slice(2));
    const c = curve(sa, sb, sameLoc);
    const single = e.pairs.length === 1 && e.a.startsWith("n:") && e.b.startsWith("n:");
    const pair = single ? e.pairs[0] : null;
    const rung = single ? pair.rung : e.rung;
    const fell = single ? pair.fell_back : e.fell > 0;
    const unseen = single ? model.live && !pair.seen : e.unseen === e.pairs.length && model.live;
    const boxes = e.a.startsWith("l:") && e.b.startsWith("l:");
    const width = single ? 2.5 : Math.min(9, (boxes ? 2.5 : 1.5) + (boxes ? 1 : 0.6) * Math.log2(e.pairs.length));
    const touches = sel && sel.kind === "node" && (e.a === "n:" + sel.name || e.b === "n:" + sel.name);
    const picked = sel && sel.kind === "edge" && sel.key === e.key;
    const cls = "edge" + (unseen ? " unseen" : "") + (sel && sel.kind === "node" && !touches ? " dim" : "") +
      (picked ? " picked" : "");
    const attrs = { class: cls, d: c.d, stroke: colour(rung), "stroke-width": width,
      "stroke-dasharray": fell ? "7 5" : null, "data-a": e.a.slice(2), "data-b": e.b.slice(2),
      "data-rung": rung === null ? "none" : rung, "data-fell-back": fell ? "true" : "false",
      "data-pairs": e.pairs.length };
    if (single) attrs["data-pair"] = pair.a + "|" + pair.b;
    el("path", attrs, gEdges);
    const hit = el("path", { class: "hit", d: c.d, "data-hit": e.key }, gEdges);
    const t = el("title", {}, hit);
    t.textContent = (single ? pair.a + " \u2013 " + pair.b + ": " : e.a.slice(2) + " \u2013 " + e.b.slice(2) + ": ") +
      countsText(e.counts) + (fell ? " (fell back)" : "");
    hit.addEventListener("click", (ev) => { ev.stopPropagation(); pickEdge(e.key); });
    if (labelled && !single) {
      el("text", { class: "label", x: c.mid.x, y: c.mid.y - 4, "text-anchor": "middle" }, gEdges,
        short(countsText(e.counts), 40));
    }
  }
  for (const [name, pos] of lay.nodePos) {
    const n = idx.nodes.get(name);
    const peer = name.startsWith("peer:");
    const cls = "node" + (n && n.leader ? " leader" : "") + (peer ? " peer" : "") +
      (sel && sel.kind === "node" && sel.name === name ? " selected" : "") + (state.found === name ? " found" : "");
    const g = el("g", { class: cls, "data-node": name }, gNodes);
    el("rect", { x: pos.x - SIZE.nodeW / 2, y: pos.y - SIZE.nodeH / 2, width: SIZE.nodeW, height: SIZE.nodeH, rx: 5 }, g);
    el("text", { x: pos.x, y: pos.y + 4.5, "text-anchor": "middle" }, g,
      short((peer ? name.slice(5) : name) + (n && n.leader ? " \u2605" : ""), 16));
    const t = el("title", {}, g);
    t.textContent = peer ? name : name + "\npod CIDRs " + n.pod_cidrs.join(", ") + (n.internal_ip ? "\ninternal " + n.internal_ip : "") +
      (n.endpoint ? "\nendpoint " + n.endpoint : "") + (n.leader ? "\nleads its location" : "");
    g.addEventListener("click", (ev) => { ev.stopPropagation(); pickNode(name); });
  }
  if (state.fitNext || !state.view) { fit(lay); state.fitNext = false; }
  applyView();
}

// --- pan and zoom ----------------------------------------------------------------------------------

// The whole map in the window, at the top, above the legend (which stays where it is).
function fit(lay) {
  const svg = document.getElementById("map");
  const r = svg.getBoundingClientRect();
  const legendH = document.getElementById("legend").offsetHeight + 16;
  const W = r.width || 800, H = r.height || 600;
  const scale = Math.min(W / lay.width, Math.max(H - legendH, H / 2) / lay.height, 1.6);
  const vw = W / scale, vh = H / scale;
  state.view = { x: (lay.width - vw) / 2, y: 0, w: vw, h: vh };
}

function applyView() {
  const v = state.view;
  document.getElementById("map").setAttribute("viewBox", `${v.x} ${v.y} ${v.w} ${v.h}`);
}

function centreOn(x, y) {
  const v = state.view;
  v.x = x - v.w / 2; v.y = y - v.h / 2;
  applyView();
}

function setupPanZoom() {
  const svg = document.getElementById("map");
  let drag = null;
  svg.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const r = svg.getBoundingClientRect(), v = state.view;
    const f = ev.deltaY > 0 ? 1.15 : 1 / 1.15;
    const px = v.x + (ev.clientX - r.left) / r.width * v.w, py = v.y + (ev.clientY - r.top) / r.height * v.h;
    v.w *= f; v.h *= f;
    v.x = px - (ev.clientX - r.left) / r.width * v.w; v.y = py - (ev.clientY - r.top) / r.height * v.h;
    applyView();
  }, { passive: false });
  svg.addEventListener("pointerdown", (ev) => {
    if (ev.button !== 0) return;
    drag = { x: ev.clientX, y: ev.clientY, vx: state.view.x, vy: state.view.y, moved: false };
  });
  window.addEventListener("pointermove", (ev) => {
    if (!drag) return;
    const r = svg.getBoundingClientRect();
    const dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) { drag.moved = true; svg.classList.add("panning"); }
    state.view.x = drag.vx - dx / r.width * state.view.w;
    state.view.y = drag.vy - dy / r.height * state.view.h;
    applyView();
  });
  window.addEventListener("pointerup", () => {
    if (drag && drag.moved) {
      // a drag is no click: swallow the click that follows it
      window.addEventListener("click", (e) => e.stopPropagation(), { capture: true, once: true });
    }
    drag = null; svg.classList.remove("panning");
  });
}

// --- interaction ---------------------------------------------------------------------------------

function toggle(key) {
  if (state.expanded.has(key)) state.expanded.delete(key); else state.expanded.add(key);
  state.fitNext = true;
  draw();
}

function panel(...kids) {
  state.nodePanel = null; // what the panel shows now is not a node's (showNode sets it after)
  document.getElementById("panel").replaceChildren(...kids);
}

function record(rec) {
  return h("table", {}, ...Object.entries(rec).map(([k, v]) =>
    h("tr", {}, h("th", {}, k), h("td", {}, typeof v === "object" ? JSON.stringify(v) : String(v)))));
}

async function pickNode(name) {
  state.selected = { kind: "node", name };
  draw();
  await showNode(name, false);
}

// The node's panel; `quiet` (a new map came while it is shown): redrawn in place, no "reading".
async function showNode(name, quiet) {
  if (name.startsWith("peer:")) {
    const p = state.doc.model.peers.find((x) => "peer:" + x.name === name);
    panel(h("h2", {}, name.slice(5)), h("p", { class: "muted" }, "a WireGuard peer that is not a node"),
      record({ allowed_ips: p ? p.allowed_ips.join(", ") : "-" }));
    return;
  }
  if (!quiet) panel(h("h2", {}, name), h("p", { class: "muted" }, "reading\u2026"));
  let d;
  try { d = await getJSON("/api/node?name=" + encodeURIComponent(name)); } catch (e) {
    panel(h("h2", {}, name), h("p", { class: "err" }, String(e.message))); return;
  }
  if (!state.selected || state.selected.name !== name || (quiet && state.nodePanel !== name)) return;
  const rows = d.peers.map((p) => {
    const here = p.here, there = p.there;
    const now = here ? chip(here.rung, here.fell_back) : there ? chip(there.rung, there.fell_back) :
      h("span", { class: "muted" }, d.live ? "not reported" : "-");
    const tr = h("tr", { class: "click", "data-peer": p.peer, title: "explain " + name + " \u2192 " + p.peer },
      h("td", {}, p.peer), h("td", {}, now), h("td", {}, there ? chip(there.rung, there.fell_back) : "-"),
      h("td", {}, p.planned === null ? "-" : p.planned + (p.relay ? " via " + p.relay : "")),
      h("td", {}, fmtMs(here && here.rtt_ms)), h("td", {}, fmtLoss(here && here.loss)),
      h("td", {}, fmtAge(here && here.handshake_age_s)));
    tr.addEventListener("click", () => pickPair(name, p.peer));
    return tr;
  });
  const extra = d.extra_peers.length ? [h("h3", {}, "other WireGuard peers"),
    h("table", {}, ...d.extra_peers.map((p) => h("tr", {}, h("td", {}, p.peer), h("td", {}, p.allowed_ips.join(", ")))))] : [];
  panel(h("h2", {}, name),
    h("p", {}, "location ", h("b", {}, d.location), d.granularity !== "location" ? "" :
      d.leader === name ? " (its leader)" : " \u00b7 leader " + d.leader, " \u00b7 granularity " + d.granularity),
    h("h3", {}, "record"), record(d.record),
    h("h3", {}, "peers and paths (" + d.peers.length + ")"),
    h("p", { class: "muted" }, d.live ? "now: what " + name + " sees (else what the peer sees); there: what the peer " +
      "sees of " + name + "; planned: the plan's path. Click a row to explain the pair." :
      "the plan only: the agents' summaries are read from the cluster (--backend etcd|kubernetes or --lab)"),
    h("table", { id: "peers" }, h("tr", {}, h("th", {}, "peer"), h("th", {}, "now"), h("th", {}, "there"),
      h("th", {}, "planned"), h("th", {}, "rtt"), h("th", {}, "loss"), h("th", {}, "handshake")), ...rows),
    ...extra);
  state.nodePanel = name;
}

function pickEdge(key) {
  const e = state.layout.lines.get(key);
  if (!e) return;
  state.selected = { kind: "edge", key };
  draw();
  if (e.pairs.length === 1) { pickPair(e.pairs[0].a, e.pairs[0].b, true); return; }
  const rows = e.pairs.slice(0, MAX_PANEL_PAIRS).map((p) => {
    const tr = h("tr", { class: "click" }, h("td", {}, p.a), h("td", {}, p.b),
      h("td", {}, chip(p.rung, p.fell_back, state.doc.model.live && !p.seen)));
    tr.addEventListener("click", () => pickPair(p.a, p.b, true));
    return tr;
  });
  panel(h("h2", {}, e.a.slice(2) + " \u2013 " + e.b.slice(2)), h("p", {}, countsText(e.counts) +
      (e.fell ? "; " + e.fell + " fell back from their first rung" : "")),
    h("p", { class: "muted" }, "Click a pair to explain it" + (e.pairs.length > MAX_PANEL_PAIRS ? " (the first " +
      MAX_PANEL_PAIRS + " of " + e.pairs.length + " are listed)" : "") + "."),
    h("table", {}, h("tr", {}, h("th", {}, "from"), h("th", {}, "to"), h("th", {}, "rung now")), ...rows));
}

async function pickPair(a, b, keepSelection) {
  if (!keepSelection) { state.selected = { kind: "node", name: a }; draw(); }
  const p = state.doc.model.pairs.find((x) => (x.a === a && x.b === b) || (x.a === b && x.b === a));
  const head = [h("h2", {}, a + " \u2192 " + b), p ? h("p", {}, "rung now ", chip(p.rung, p.fell_back,
    state.doc.model.live && !p.seen), p.fell_back ? " (fell back from its first rung)" : "") : null];
  if (state.meta.explain !== null) { panel(...head, h("p", { class: "muted" }, state.meta.explain)); return; }
  if (a.startsWith("peer:") || b.startsWith("peer:")) {
    panel(...head, h("p", { class: "muted" }, "explain follows pairs of nodes")); return;
  }
  panel(...head, h("p", { class: "muted" }, "meshctl explain " + a + " " + b + " \u2026"));
  try {
    const d = await getJSON("/api/explain?src=" + encodeURIComponent(a) + "&dst=" + encodeURIComponent(b));
    panel(...head, h("h3", {}, "meshctl explain " + a + " " + b), h("pre", { id: "explain" }, d.text));
  } catch (e) {
    panel(...head, h("p", { class: "err" }, String(e.message)));
  }
}

function focusNode(name) {
  const idx = state.layout.idx;
  const loc = idx.nodeLoc.get(name);
  if (loc === undefined) return;
  if (!state.expanded.has(loc)) { state.expanded.add(loc); state.fitNext = true; }
  state.found = name;
  draw();
  const pos = state.layout.lay.nodePos.get(name);
  if (pos) centreOn(pos.x, pos.y);
  pickNode(name);
}

function setupSearch() {
  const form = document.getElementById("search"), q = document.getElementById("q"), list = document.getElementById("hits");
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const text = q.value.trim();
    if (!text) return;
    let d;
    try { d = await getJSON("/api/search?q=" + encodeURIComponent(text)); } catch (e) {
      list.replaceChildren(h("li", { class: "err" }, String(e.message))); list.hidden = false; return;
    }
    if (d.hits.length === 1) { list.hidden = true; focusNode(d.hits[0].node); return; }
    list.replaceChildren(...(d.hits.length ? d.hits.map((hit) => {
      const li = h("li", { "data-node": hit.node }, hit.node, h("small", {}, hit.why));
      li.addEventListener("click", () => { list.hidden = true; focusNode(hit.node); });
      return li;
    }) : [h("li", { class: "muted" }, "nothing found for " + text)]));
    list.hidden = false;
  });
  document.addEventListener("click", (ev) => { if (!form.contains(ev.target)) list.hidden = true; });
}

// --- the poll ------------------------------------------------------------------------------------

function legend() {
  const box = document.getElementById("legend");
  const row = (stroke, dash, label, cls) => {
    const s = el("svg", { viewBox: "0 0 34 10" });
    el("line", { x1: 2, y1: 5, x2: 32, y2: 5, stroke, "stroke-width": 3, "stroke-dasharray": dash, class: cls }, s);
    return h("div", {}, s, label);
  };
  box.replaceChildren(...Object.entries(state.meta.colours).map(([r, c]) => row(c, null, r)),
    row(state.meta.no_path, null, "no path"), row("#546e7a", "7 5", "fell back from its first rung"),
    ...(state.meta.live ? [row("#546e7a", null, "not reported (the plan's rung)", "edge unseen")] : []));
}

function status() {
  const s = document.getElementById("status");
  if (!state.doc) return;
  const m = state.doc.model;
  const age = Math.max(0, Math.round((Date.now() - state.lastOk) / 1000));
  const broken = m.pairs.filter((p) => p.rung === null).length, fell = m.pairs.filter((p) => p.fell_back).length;
  s.textContent = `${m.nodes.length} nodes, ${m.locations.length} locations, ${m.pairs.length} pairs` +
    (broken ? `, ${broken} without a path` : "") + (fell ? `, ${fell} fell back` : "") +
    ` \u00b7 ${state.meta.live ? "live" : "plan"} \u00b7 updated ${age} s ago`;
  const banner = document.getElementById("banner");
  const err = state.pollError || state.doc.error;
  if (err) {
    banner.className = ""; banner.hidden = false;
    banner.textContent = (state.pollError ? "the page's server does not answer: " : "the backend fails: ") + err +
      " (showing the map as last read)";
  } else if (state.doc.warnings.length) {
    banner.className = "warn"; banner.hidden = false;
    banner.textContent = "warning: " + state.doc.warnings.join("; warning: ");
  } else {
    banner.hidden = true;
  }
}

async function poll() {
  try {
    const headers = state.etag ? { "If-None-Match": state.etag } : {};
    const r = await fetch("/api/graph", { cache: "no-store", headers });
    if (r.status === 200) {
      state.doc = await r.json();
      state.etag = r.headers.get("ETag");
      draw();
      if (state.nodePanel) showNode(state.nodePanel, true); // its peers' rungs changed too
    } else if (r.status !== 304) {
      throw new Error((await r.json()).error || r.statusText);
    }
    state.lastOk = Date.now();
    state.pollError = null;
    document.body.setAttribute("data-version", state.etag || "");
  } catch (e) {
    state.pollError = String(e.message || e);
  }
  status();
  setTimeout(poll, state.meta.poll_ms);
}

async function start() {
  state.meta = await getJSON("/api/meta");
  document.getElementById("source").textContent = state.meta.source + (state.meta.lab ? " (lab " + state.meta.lab + ")" : "") +
    (state.meta.live ? " \u00b7 live" : " \u00b7 plan only");
  legend();
  setupPanZoom();
  setupSearch();
  document.getElementById("fit").addEventListener("click", () => { fit(state.layout.lay); applyView(); });
  document.getElementById("expand-all").addEventListener("click", () => {
    state.expanded = new Set(state.layout.idx.locs.keys()); state.fitNext = true; draw();
  });
  document.getElementById("collapse-all").addEventListener("click", () => {
    state.expanded = new Set(["peers"]); state.fitNext = true; draw();
  });
  document.getElementById("map").addEventListener("click", () => {
    state.selected = null; state.found = null; draw();
  });
  window.addEventListener("resize", () => { if (state.layout) { fit(state.layout.lay); applyView(); } });
  await poll();
  setInterval(status, 1000);
}

start();
