"""The experiment grids behind the figures: sizes, and TOPAS parameters reaching TOPAS only."""

from studies import grid
from topas import sets


def test_full_and_quick_sizes():
    assert len(grid.jct_vs_load()) == 3 * 6 * 4 * 3  # workloads x policies x loads x seeds
    assert len(grid.jct_vs_load(quick=True)) == 3 * 6 * 2 * 1
    assert {e.n_tasks for e in grid.jct_vs_load(quick=True)} == {grid.QUICK.n_tasks}


def test_params_reach_only_topas_policies():
    exps = grid.jct_vs_load(["dag-4"], quick=True, params={"beta": 0.5})
    for e in exps:
        assert (dict(e.params) == {"beta": 0.5}) == e.policy.startswith("topas")


def test_ablations_cover_every_variant_and_baseline():
    pols = {e.policy for e in grid.ablations(quick=True)}
    assert pols == set(sets.ABLATIONS) | set(sets.PAPER_BASELINES)


def test_sensitivity_is_the_cartesian_product_of_its_axes():
    exps = grid.sensitivity(axes={"beta": (0.0, 1.0, 2.0), "rho": (0.0, 1.0)})
    assert len(exps) == 3 * 2 * len(grid.FULL.seeds)
    assert {tuple(sorted(dict(e.params))) for e in exps} == {("beta", "rho")}
    assert len(grid.sensitivity(quick=True)) == 2 * 2  # quick keeps two values per axis, one seed


def test_engine_model_grid_pairs_the_figures_runs_with_each_other_engine_model():
    exps = grid.engine_model(["dag-4"], load=1.2, quick=True)
    by_model = {m: [e for e in exps if e.engine_model == m] for m in grid.ENGINE_MODELS}
    assert set(by_model) == {"stock", "host_tier=True", "legacy"}
    assert all(len(v) == len(sets.PAPER_POLICIES) * len(grid.QUICK.seeds) for v in by_model.values())
    keys = [{e.key() for e in v} for v in by_model.values()]
    assert len(set().union(*keys)) == sum(len(k) for k in keys)  # every model has its own keys
    # full size: the stock third is the figures' jct_vs_load runs at 1.2x, the same keys (no re-run)
    figures = {e.key() for e in grid.jct_vs_load(["dag-4"]) if e.load == 1.2}
    assert {e.key() for e in grid.engine_model(["dag-4"]) if e.engine_model == "stock"} == figures


def test_the_overhead_runs_are_topas_at_one_load_once_per_seed():
    runs = grid.overhead_runs()
    assert [e.seed for e in runs] == list(grid.FULL.seeds)
    assert {(e.workload, e.policy, e.load, e.n_tasks) for e in runs} == {
        (grid.OVERHEAD_WORKLOAD, "topas", grid.OVERHEAD_LOAD, grid.FULL.n_tasks)}
    assert set(runs) <= set(grid.notebook_grid())  # planned with the notebooks' runs


def test_notebooks_05_and_08_default_to_the_declared_overhead_runs():
    import nbformat

    from topas.paths import REPO_ROOT

    for name, prefix in (("05_overhead", ""), ("08_paper_vs_ours", "overhead_")):
        cells = nbformat.read(REPO_ROOT / "notebooks" / f"{name}.ipynb", as_version=4).cells
        ns: dict = {}
        exec(next(c.source for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])), ns)
        assert (ns[f"{prefix}workload"], ns[f"{prefix}load"]) == (grid.OVERHEAD_WORKLOAD, grid.OVERHEAD_LOAD), name
        assert "grid.overhead_runs(" in "".join(c.source for c in cells)
