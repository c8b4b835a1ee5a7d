// The attention page: translate one sentence, then draw the weights POST /attention returns.
// Plain DOM, no libraries: the page must work offline, served by transformer-mt-serve alone.
"use strict";

const $ = (id) => document.getElementById(id);

// A source piece counts as attended when its weight is at least this share of the row's largest.
const ATTENDED_SHARE = 0.5;

// Viridis, sampled at five stops: a perceptually even ramp from 0 (dark) to 1 (bright).
const RAMP = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];

const state = { maps: null, activeRow: null, alignment: null };

function color(weight) {
  const x = Math.min(Math.max(weight, 0), 1) * (RAMP.length - 1);
  const i = Math.min(Math.floor(x), RAMP.length - 2);
  const f = x - i;
  const rgb = RAMP[i].map((c, k) => Math.round(c + f * (RAMP[i + 1][k] - c)));
  return `rgb(${rgb.join(",")})`;
}

function showError(message) {
  const box = $("error");
  box.textContent = message || "";
  box.hidden = !message;
}

// The service's API key, when it has one: taken from the address (/#key=KEY: a fragment never
// reaches the server or its logs), or asked for at the first 401; kept for this tab only.
const KEY_SLOT = "transformer-mt-api-key";
const fromAddress = location.hash.match(/(?:^#|&)key=([^&]*)/);
if (fromAddress) {
  sessionStorage.setItem(KEY_SLOT, decodeURIComponent(fromAddress[1]));
  history.replaceState(null, "", location.pathname + location.search);
}

function withKey(headers) {
  const key = sessionStorage.getItem(KEY_SLOT);
  return key ? { ...headers, Authorization: `Bearer ${key}` } : headers;
}

// fetch with the key; a 401 asks for the key once and tries again.
async function call(path, init = {}) {
  const send = () => fetch(path, { ...init, headers: withKey(init.headers || {}) });
  const response = await send();
  if (response.status !== 401) return response;
  const key = window.prompt("This service needs its API key:");
  if (!key) return response;
  sessionStorage.setItem(KEY_SLOT, key.trim());
  return send();
}

async function post(path, body) {
  const response = await call(path, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  const data = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (!response.ok) throw new Error(data.error || `HTTP ${response.status}`);
  return data;
}

// The decoding options of the form: the beam size, and the target language of a model that
// translates into several (the selector is shown only for such a model).
function options() {
  const beam = parseInt($("beam").value, 10);
  const chosen = Number.isFinite(beam) ? { beam_size: beam } : {};
  if (!$("tgt-lang-field").hidden) chosen.tgt_lang = $("tgt-lang").value;
  return chosen;
}

async function busy(label, work) {
  const buttons = [$("translate"), $("attend")];
  buttons.forEach((b) => (b.disabled = true));
  $("status").textContent = label;
  showError("");
  try {
    await work();
    $("status").textContent = "";
  } catch (err) {
    $("status").textContent = "";
    showError(err.message);
  } finally {
    buttons.forEach((b) => (b.disabled = false));
  }
}

async function translate() {
  const text = $("source").value.trim();
  if (!text) return showError("Type a sentence to translate.");
  const prefix = $("prefix").value.trim();
  const body = { text: [text], alignments: true, ...options() };
  if (prefix) body.prefix = [prefix];
  $("alignment").hidden = true;
  await busy("translating…", async () => {
    const result = await post("/translate", body);
    $("output").value = result.translations[0];
    showAlignment(text, result.translations[0], result.alignments[0]);
    await attend(text, result.translations[0]);
  });
}

// Words as the service's alignments count them: runs of characters between spaces, tabs and
// line breaks.
function words(text) {
  return text.split(/[ \t\r\n\f\v]+/).filter((word) => word.length > 0);
}

// "0-0 1-2" -> [[0, 0], [1, 2]]: pairs of (source word, output word).
function parsePharaoh(text) {
  return text ? text.split(" ").map((pair) => pair.split("-").map(Number)) : [];
}

function showAlignment(source, output, pharaoh) {
  state.alignment = { output, pairs: parsePharaoh(pharaoh) };
  const make = (list, side) =>
    list.map((word, i) => {
      const span = document.createElement("span");
      span.className = `token word ${side}-word`;
      span.textContent = word;
      span.dataset.index = i;
      span.addEventListener("mouseenter", () => markAligned(side, i));
      return span;
    });
  $("out-words").replaceChildren(...make(words(output), "out"));
  $("src-words").replaceChildren(...make(words(source), "src"));
  $("pharaoh").textContent = pharaoh || "(none)";
  $("alignment").hidden = false;
}

// Hovering word `index` of `side` ("out" or "src") marks it and the words it is aligned to.
function markAligned(side, index) {
  const [mine, theirs] = side === "out" ? [1, 0] : [0, 1];
  const linked = new Set(
    state.alignment.pairs.filter((pair) => pair[mine] === index).map((pair) => pair[theirs])
  );
  const other = side === "out" ? "src" : "out";
  document.querySelectorAll(`.${side}-word`).forEach((el) => {
    el.classList.toggle("active", Number(el.dataset.index) === index);
  });
  document.querySelectorAll(`.${other}-word`).forEach((el) => {
    el.classList.remove("active");
    el.classList.toggle("aligned", linked.has(Number(el.dataset.index)));
  });
  document.querySelectorAll(`.${side}-word`).forEach((el) => el.classList.remove("aligned"));
}

async function attend(text, translation) {
  $("status").textContent = "recording attention…";
  const lang = $("tgt-lang-field").hidden ? {} : { tgt_lang: $("tgt-lang").value };
  state.maps = await post("/attention", { text, translation, ...lang });
  const cut = Object.entries(state.maps.truncated || {}).filter(([, n]) => n > 0);
  if (cut.length) {
    const what = cut.map(([side, n]) => `${n} tokens of the ${side}`).join(" and ");
    showError(`The model's length limit cut ${what}: the maps show what it read.`);
  }
  state.activeRow = null;
  fillSelectors();
  $("attention").hidden = false;
  render();
}

function fillSelectors() {
  const maps = state.maps;
  const fill = (select, n, extra) => {
    const keep = select.value;
    select.replaceChildren();
    if (extra) select.add(new Option(extra[1], extra[0]));
    for (let i = 0; i < n; i++) select.add(new Option(String(i), String(i)));
    if ([...select.options].some((o) => o.value === keep)) select.value = keep;
  };
  fill($("layer"), maps.cross.length);
  fill($("head"), maps.n_heads, ["all", "all heads"]);
  if (!$("head").dataset.touched) $("head").value = "0";
}

// Rows and columns of each kind: the queries and the keys of that attention.
function axes(kind) {
  const m = state.maps;
  if (kind === "encoder_self") return [m.source_tokens, m.source_tokens];
  if (kind === "decoder_self") return [m.output_tokens, m.input_tokens];
  return [m.output_tokens, m.source_tokens];
}

function heads() {
  const choice = $("head").value;
  return choice === "all" ? [...Array(state.maps.n_heads).keys()] : [parseInt(choice, 10)];
}

function render() {
  const kind = $("kind").value;
  const layer = parseInt($("layer").value, 10);
  const [rows, cols] = axes(kind);
  const figures = heads().map((head) => heatmap(kind, layer, head, rows, cols));
  $("maps").replaceChildren(...figures);
  strips();
  highlight(state.activeRow);
}

function heatmap(kind, layer, head, rows, cols) {
  const weights = state.maps[kind][layer][head];
  const figure = document.createElement("figure");
  figure.className = "map";
  const caption = document.createElement("figcaption");
  caption.textContent = `layer ${layer} · head ${head}`;
  const table = document.createElement("table");
  Object.assign(table.dataset, { kind, layer, head });
  table.className = "heatmap";
  const head_row = table.createTHead().insertRow();
  head_row.appendChild(document.createElement("th"));
  cols.forEach((label, j) => {
    const th = document.createElement("th");
    th.textContent = label;
    th.dataset.col = j;
    head_row.appendChild(th);
  });
  const body = table.createTBody();
  rows.forEach((label, i) => {
    const tr = body.insertRow();
    tr.dataset.row = i;
    const th = document.createElement("th");
    th.textContent = label;
    if (kind === "cross") th.addEventListener("mouseenter", () => highlight(i));
    tr.appendChild(th);
    weights[i].forEach((w, j) => {
      const td = tr.insertCell();
      td.style.background = color(w);
      td.title = `${label} → ${cols[j]}: ${w.toFixed(3)}`;
    });
  });
  figure.append(caption, table);
  return figure;
}

function strips() {
  const m = state.maps;
  const make = (labels, cls, hover) =>
    labels.map((label, i) => {
      const span = document.createElement("span");
      span.className = `token ${cls}`;
      span.textContent = label;
      span.dataset.index = i;
      if (hover) span.addEventListener("mouseenter", () => highlight(i));
      return span;
    });
  $("out-strip").replaceChildren(...make(m.output_tokens, "out-token", true));
  $("src-strip").replaceChildren(...make(m.source_tokens, "src-token", false));
}

// Cross-attention of output piece `row` over the source: the chosen head, or the heads' mean.
function crossRow(row) {
  const layer = parseInt($("layer").value, 10);
  const chosen = heads();
  const per_head = chosen.map((h) => state.maps.cross[layer][h][row]);
  return per_head[0].map((_, j) => per_head.reduce((s, w) => s + w[j], 0) / per_head.length);
}

function highlight(row) {
  state.activeRow = row;
  document.querySelectorAll(".out-token").forEach((el) => {
    el.classList.toggle("active", row !== null && Number(el.dataset.index) === row);
  });
  document.querySelectorAll("table.heatmap tbody tr").forEach((tr) => {
    tr.classList.toggle("active", row !== null && Number(tr.dataset.row) === row);
  });
  const weights = row === null ? null : crossRow(row);
  const top = weights ? Math.max(...weights) : 0;
  const mark = (el, j) => {
    const w = weights ? weights[j] : 0;
    el.classList.toggle("attended", weights !== null && w >= ATTENDED_SHARE * top);
    return w;
  };
  document.querySelectorAll(".src-token").forEach((el) => {
    const w = mark(el, Number(el.dataset.index));
    el.style.background = weights ? `rgba(var(--glow), ${(w / top).toFixed(3)})` : "white";
  });
  document.querySelectorAll('table.heatmap[data-kind="cross"] thead th[data-col]').forEach((th) => {
    mark(th, Number(th.dataset.col));
  });
}

// A model with several target languages gets a selector, set to the service's default
// language when it has one (transformer-mt-serve --tgt-lang), else to the first.
function showLanguages(languages, fixed) {
  if (languages.length < 2) return;
  $("tgt-lang").replaceChildren(...languages.map((lang) => new Option(lang, lang)));
  $("tgt-lang").value = fixed && languages.includes(fixed) ? fixed : languages[0];
  $("tgt-lang-field").hidden = false;
}

async function loadModel() {
  try {
    const response = await call("/model");
    const info = await response.json();
    if (!response.ok) throw new Error(info.error || `HTTP ${response.status}`);
    const bleu = info.val_bleu == null ? "" : `, validation BLEU ${info.val_bleu.toFixed(2)}`;
    const params = (info.parameters / 1e6).toFixed(info.parameters < 1e6 ? 3 : 1);
    $("model-info").textContent =
      `${info.src_lang || "?"} → ${info.tgt_lang || (info.target_languages || []).join("/") || "?"}` +
      ` · ${info.checkpoint} · ` +
      `${params} M parameters · ${info.config.n_encoder_layers} + ${info.config.n_decoder_layers} ` +
      `layers × ${info.config.n_heads} heads · engine ${info.engine}${bleu}`;
    showLanguages(info.target_languages || [], info.tgt_lang);
    $("beam").value = info.decoding.beam_size;
    $("beam").max = info.limits.max_beam;
  } catch (err) {
    $("model-info").textContent = `GET /model failed: ${err.message}`;
  }
}

$("translate").addEventListener("click", translate);
["source", "prefix"].forEach((id) =>
  $(id).addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      event.preventDefault();
      translate();
    }
  })
);
$("attend").addEventListener("click", () => {
  const text = $("source").value.trim();
  if (!text) return showError("Type a sentence first.");
  // The alignment is the model's translation's: an output of the user's own has none.
  if (!state.alignment || $("output").value !== state.alignment.output) {
    $("alignment").hidden = true;
  }
  busy("recording attention…", () => attend(text, $("output").value));
});
$("kind").addEventListener("change", render);
$("layer").addEventListener("change", render);
$("head").addEventListener("change", () => {
  $("head").dataset.touched = "1";
  render();
});
loadModel();
