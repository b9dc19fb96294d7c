// Draws the runs that `python -m gumiho page` embedded in index.html. Text from a trace is set with textContent;
// the HTML strings come from the app's renderers (app/render.py), which escape every token and prompt.
"use strict";

// The runs: index.html holds them as gzipped JSON written in hex digits.
async function unpack(hex) {
  const bytes = new Uint8Array(hex.length / 2);
  for (let i = 0; i < bytes.length; i++) bytes[i] = parseInt(hex.substr(2 * i, 2), 16);
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return JSON.parse(await new Response(stream).text());
}

unpack(document.getElementById("gm-data").textContent.trim()).then((data) => {
  const byId = (id) => document.getElementById(id);
  const PLOT_CONFIG = { responsive: true, displaylogo: false };
  let group = null;
  let run = null;
  let cycle = 0;

  function plot(id, figure) {
    Plotly.react(byId(id), figure.data, { ...figure.layout, template: data.template }, PLOT_CONFIG);
  }

  function picker(id, labels, active, pick) {
    byId(id).replaceChildren(...labels.map((label, i) => {
      const button = document.createElement("button");
      button.type = "button";
      button.textContent = label;
      button.title = label;
      button.setAttribute("aria-pressed", String(i === active));
      button.addEventListener("click", () => pick(i));
      return button;
    }));
  }

  function showCycle(k) {
    cycle = Math.min(Math.max(k, 0), run.cycles.length - 1);
    const step = run.cycles[cycle];
    byId("gm-cycle").value = String(cycle);
    byId("gm-cycle-label").textContent = run.steps ? `Cycle ${cycle} of ${run.steps - 1}` : "no cycles recorded";
    byId("gm-caption").innerHTML = step.caption;
    plot("gm-tree", step.tree);
    for (const span of byId("gm-output").querySelectorAll(".gm-cycle")) {
      span.classList.toggle("gm-selected", Number(span.dataset.cycle) === cycle);
    }
  }

  function showRun(i) {
    run = group.runs[i];
    picker("gm-runs", group.runs.map((r) => r.label), i, showRun);
    byId("gm-summary").innerHTML = run.summary;
    byId("gm-legend").innerHTML = run.legend;
    byId("gm-output").innerHTML = run.output;
    byId("gm-cycle").max = String(run.cycles.length - 1);
    byId("gm-cycle").disabled = run.cycles.length < 2;
    showCycle(run.start);
  }

  function showGroup(g) {
    group = data.groups[g];
    if (data.groups.length > 1) {
      picker("gm-prompts", data.groups.map((x) => x.prompt), g, showGroup);
    }
    byId("gm-prompt").textContent = group.prompt;
    showRun(group.start);
    const race = group.race;
    byId("gm-race").hidden = !race;
    if (race) {
      byId("gm-headline").innerHTML = race.headline;
      byId("gm-table").innerHTML = race.table;
      plot("gm-timeline", race.timeline);
      plot("gm-tau", race.tau);
      plot("gm-timing", race.timing);
      byId("gm-texts").innerHTML = race.texts;
    }
  }

  // Keys step the cycles unless focus is where they edit or move something else (a text field, the slider itself).
  function typing(target) {
    return target instanceof HTMLElement &&
      (target.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName));
  }

  document.addEventListener("keydown", (event) => {
    const step = { ArrowLeft: -1, ArrowRight: 1 }[event.key];
    if (!step || event.altKey || event.ctrlKey || event.metaKey || typing(event.target)) return;
    event.preventDefault();
    showCycle(cycle + step);
  });
  byId("gm-cycle").addEventListener("input", (event) => showCycle(Number(event.target.value)));
  byId("gm-prev").addEventListener("click", () => showCycle(cycle - 1));
  byId("gm-next").addEventListener("click", () => showCycle(cycle + 1));
  byId("gm-output").addEventListener("click", (event) => {
    const span = event.target.closest(".gm-cycle");
    if (span) showCycle(Number(span.dataset.cycle));
  });

  const note = byId("gm-note");
  note.textContent = data.note;
  note.hidden = !data.note;
  showGroup(0);
}).catch((error) => {
  const note = document.getElementById("gm-note");
  note.textContent = `This page cannot read its runs (${error}): it needs a browser from 2023 or later.`;
  note.hidden = false;
});
