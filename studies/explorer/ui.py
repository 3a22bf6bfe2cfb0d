"""The weights explorer's sliders (notebook 09): :class:`Explorer` keeps the starting setting as a
reference, runs on slider release, says what it is running, prints the change against the start,
the loads above a policy's certified capacity and the weights that change nothing here."""

from __future__ import annotations

from typing import Any, Mapping

import matplotlib.pyplot as plt

from studies.explorer import runs as ex
from studies.explorer.plots import TOPAS_SLIDERS, Slider, fmt_value, jct_xlim, plot_explorer, slider_choices
from topas.experiments.notebook_params import headless
from topas.plots.style import policy_label, workload_label


class Explorer:
    """TOPAS (its weights: ``sliders``), TOPAS+ (its H_age) and a baseline on one small workload.

    ``topas``: the starting value of weights of ``sliders`` (the others: TOPAS's defaults);
    together they are the reference curve;
    ``plus_H_age``: TOPAS+'s starting aging horizon.
    """

    def __init__(self, workload: str, baseline: str, load: float, seed: int, n_tasks: int,
                 topas: Mapping[str, float], plus_H_age: float, sliders: Mapping[str, Slider] = TOPAS_SLIDERS,
                 progress: bool = True) -> None:
        self.workload, self.baseline, self.load, self.seed, self.n_tasks = workload, baseline, load, seed, n_tasks
        from dataclasses import asdict

        from topas.policies.topas_params import TopasParams

        self.sliders = dict(sliders)
        defaults = asdict(TopasParams())
        self.start = {k: topas.get(k, defaults[k]) for k in self.sliders}
        self.plus_start = plus_H_age
        self.setting = f"{workload_label(workload)}, {n_tasks} tasks, load {load:g}x, seed {seed}"
        self.reference = self.runs(self.start, plus_H_age)
        self.inert, self.probed = self._probe(progress)
        everything = [r.jct for r in self.reference.values()] + [r.jct for r in self._probe_runs]
        self.xlim = jct_xlim(everything)  # fixed for this workload: curves never jump

    def _run(self, policy: str, params: Mapping[str, Any]) -> ex.Run:
        return ex.run(self.workload, policy, params, self.load, self.seed, self.n_tasks)

    def runs(self, topas: Mapping[str, float], plus_H_age: float) -> dict[str, ex.Run]:
        return {"topas": self._run("topas", topas), "topas-plus": self._run("topas-plus", {"H_age": plus_H_age}),
                self.baseline: self._run(self.baseline, {})}

    def _probe(self, progress: bool) -> tuple[list[str], dict[str, tuple[float, float]]]:
        """Run TOPAS at each weight's lowest and highest slider value (the others at the start)."""
        from tqdm.auto import tqdm

        probed = {w: (min(s.choices), max(s.choices)) if _numeric(s.choices) else (s.choices[0], s.choices[-1])
                  for w, s in self.sliders.items()}
        runs: dict[str, list[ex.Run]] = {}
        bar = tqdm(total=2 * len(probed), desc="each weight's range", disable=not progress or headless())
        for w, values in probed.items():
            runs[w] = []
            for v in values:
                runs[w].append(self._run("topas", {**self.start, w: v}))
                bar.update()
        bar.close()
        self._probe_runs = [r for rs in runs.values() for r in rs]
        return ex.inert_weights(self.reference["topas"], runs), probed

    def figure(self, topas: Mapping[str, float], plus_H_age: float):
        now = self.runs(topas, plus_H_age)
        return plot_explorer({k: r.jct for k, r in now.items()}, {k: r.jct for k, r in self.reference.items()},
                             now["topas"].terms, self.reference["topas"].terms, self.xlim,
                             title=f"{self.setting}; dashed: the start")

    def report(self, topas: Mapping[str, float], plus_H_age: float) -> list[str]:
        """The lines printed under the figure: the setting, the change per policy against the
        start, the term that decides, overload warnings and the weights that change nothing."""
        now = self.runs(topas, plus_H_age)
        setting = ", ".join(f"{k}={fmt_value(v)}" for k, v in topas.items()) + f"; TOPAS+ H_age={plus_H_age:g}"
        lines = [f"shown: {setting}"]
        lines += [ex.change_line(policy_label(p), now[p], self.reference[p]) for p in now]
        terms = now["topas"].terms
        if terms:
            top = max(terms, key=lambda t: abs(terms[t]))
            lines.append("TOPAS, mean per decision of the chosen plans (s; V_reuse includes beta): "
                         + ", ".join(f"{t} {v:.3g}" for t, v in terms.items()) + f" -> {top} decides")
        lines += ["WARNING " + w for w in ex.capacity_warnings(self.workload, self.load, now)]
        lines.append(ex.inert_note(self.inert, self.probed, self.setting))
        return lines

    def widget(self):
        """Sliders (run on release), a status line (running / shown) and the figure with its report;
        in a headless run (``notebook_params.headless``: no one to move them) a line saying so."""
        from IPython.display import Markdown, display

        if headless():
            return Markdown("*The sliders are left out of a headless run (`make reproduce`, `make figures`, the "
                            "tests): open the notebook in Jupyter to move them. The figure below is the start.*")
        import ipywidgets as W

        style, layout = {"description_width": "15em"}, W.Layout(width="34em")
        controls = {w: W.SelectionSlider(value=self.start[w], options=slider_choices(self.start[w], s.choices),
                                         description=s.label, continuous_update=False, style=style, layout=layout)
                    for w, s in self.sliders.items()}
        plus = W.SelectionSlider(value=float(self.plus_start), options=slider_choices(self.plus_start),
                                 description="TOPAS+ H_age (s)", continuous_update=False, style=style, layout=layout)
        status = W.HTML()
        out = W.Output()

        def update(_=None) -> None:
            topas = {w: c.value for w, c in controls.items()}
            status.value = "<b>running…</b> " + ", ".join(f"{k}={fmt_value(v)}" for k, v in topas.items())
            fig = self.figure(topas, plus.value)
            lines = self.report(topas, plus.value)
            with out:
                out.clear_output(wait=True)
                display(fig)
                print("\n".join(lines))
            plt.close(fig)
            status.value = "done"

        for c in [*controls.values(), plus]:
            c.observe(update, names="value")
        update()
        return W.VBox([*controls.values(), plus, status, out])


def _numeric(values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
