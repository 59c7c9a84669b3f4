"""Write the workbook notebooks (clean: no outputs). Run ``python notebooks/generate.py``.

Each notebook has one cell tagged ``parameters`` with literal defaults only (papermill injects
the sweep's values after it); derived values come in the next cell. The measuring and plotting
code lives in ``kdtree.bench``, so the notebooks stay a few lines per cell.
"""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

# Every notebook of a sweep gets these (sweep.py passes the run's paths).
RUN_PARAMETERS = '''results_path = "results/{name}"  # table written here (parquet + csv + meta)
ceilings_path = ""  # the run's ceilings.json; empty: measure now, keep nothing
run_dir = ""  # the sweep run directory, when run by a sweep'''

NOTEBOOKS = {
    "00_device_ceilings": [
        ("md", "# Device ceilings\n\nMeasured once per run; every roofline in the run is drawn on "
               "these numbers. Datasheet values appear as labels only. Without a GPU the host's "
               "numbers stand in, labelled as CPU ceilings."),
        ("parameters", "quick = True  # smaller problems, fewer repetitions\n" + RUN_PARAMETERS.format(name="ceilings")),
        ("code", "from kdtree.bench import plots\n"
                 "from kdtree.bench.ceilings import measure_ceilings\n"
                 "from kdtree.bench.results import save_table\n\n"
                 "ceilings = measure_ceilings(quick=quick)\n"
                 "if ceilings_path:\n"
                 "    ceilings.save(ceilings_path)\n"
                 "table = ceilings.table()\n"
                 "save_table(table, results_path)\n"
                 "plots.table(table)"),
        ("code", "plots.show(plots.ceilings_bars(ceilings))"),
    ],
    "01_tree_build": [
        ("md", "# Tree build, accept and KV compaction\n\nThe GPU build against the CPU builds "
               "(the paper's path and the serving-stack path, device copies included) over budget "
               "and batch, and against the serial heap kernel alone (`gpu_heap`, graph replay: the "
               "baseline of the parallel build; `parallel` in the summary is the share of sequences "
               "that took the parallel path); eager launch against graph replay; accept and "
               "compaction. Every GPU result was checked bit-identical to the reference before it "
               "was timed."),
        ("parameters", "budgets = [16, 64]  # tree budgets (nodes besides the root)\n"
                       "batches = [1]  # sequences per call\n"
                       "depth = 15  # draft depth L\n"
                       "quick = True  # fewer repetitions\n" + RUN_PARAMETERS.format(name="tree_build")),
        ("code", "from kdtree.bench import plots, roofline\n"
                 "from kdtree.bench.ceilings import get_ceilings\n"
                 "from kdtree.bench.results import save_table\n"
                 "from kdtree.bench.tree_bench import run_tree_bench, summary\n\n"
                 "ceilings = get_ceilings(ceilings_path or None, quick=True)\n"
                 "df = roofline.classify(run_tree_bench(budgets, batches, depth, out=None, quick=quick, progress=False),\n"
                 "                       ceilings)\n"
                 "save_table(df, results_path)\n"
                 "gpu = df[df['mode'] != 'host']"),
        ("md", "## Build: GPU against the CPU paths"),
        ("code", "plots.show(plots.latency(df[df.kernel == 'build'], 'budget', ['variant', 'mode'],\n"
                 "                        'Tree build time per call', ceilings, facet='batch'))\n"
                 "plots.table(summary(df))"),
        ("md", "## What an eager launch costs beyond graph replay"),
        ("code", "if not {'eager', 'graph'} <= set(gpu['mode']):\n"
                 "    print('no GPU rows timed both eagerly and in a graph in this run: the CPU paths only')\n"
                 "else:\n"
                 "    plots.show(plots.dispatch_overhead(gpu, 'budget', ['variant', 'batch'], 'GPU kernels: eager dispatch overhead',\n"
                 "                                       ceilings, facet='kernel'))"),
        ("md", "## Diagnosis"),
        ("code", "plots.table(df, ['kernel', 'variant', 'budget', 'batch', 'mode', 'l2', 'median_us', 'bound',\n"
                 "                  'fraction', 'diagnosis'])"),
    ],
    "02_verify_attention": [
        ("md", "# Tree-verify MLA attention\n\nEvery variant the package exports, checked against "
               "the reference in the same run, over q_len (= budget + 1), prefix length, batch and "
               "heads per GPU (64 heads cut into tensor-parallel shards); both L2 states, eager "
               "and graph replay. The roofline and the diagnosis use the run's measured ceilings."),
        ("parameters", "q_lens = [16, 64]  # tree nodes per sequence (budget + 1)\n"
                       "prefixes = [256]  # KV tokens before the tree\n"
                       "batches = [1]  # sequences per call\n"
                       "heads = [8]  # heads on this GPU (64 / tensor-parallel shards)\n"
                       "variants = []  # empty: every variant this device runs\n"
                       "quick = True  # fewer repetitions\n" + RUN_PARAMETERS.format(name="verify_attention")),
        ("code", "from kdtree.bench import plots, roofline\n"
                 "from kdtree.bench.attention_sweep import run_attention_sweep\n"
                 "from kdtree.bench.ceilings import get_ceilings\n"
                 "from kdtree.bench.results import save_table\n\n"
                 "ceilings = get_ceilings(ceilings_path or None, quick=True)\n"
                 "df = run_attention_sweep(q_lens, prefixes, batches, heads, variants or None, ceilings=ceilings,\n"
                 "                         quick=quick, progress=False)\n"
                 "df = roofline.classify(df, ceilings)\n"
                 "save_table(df, results_path)\n"
                 "by = ['variant', 'mode']  # lines; one panel per L2 state"),
        ("md", "## Latency scaling\n\nEager (dashed, hollow) and graph replay (solid) over the launch floors: "
               "where a line runs along its floor, the call is launch- or dispatch-bound."),
        ("code", "dims = ['q_len', 'prefix', 'batch', 'heads']\n"
                 "for x in plots.varying(df, dims):\n"
                 "    plots.show(plots.latency(df, x, by + plots.varying(df, dims, exclude=x),\n"
                 "                             f'Verify attention time against {x}', ceilings, facet='l2'))"),
        ("md", "## Achieved bandwidth against the HBM ceiling"),
        ("code", "x = (plots.varying(df, dims) or ['q_len'])[0]\n"
                 "plots.show(plots.bandwidth(df, x, by + plots.varying(df, dims, exclude=x),\n"
                 "                          'Verify attention: achieved TB/s on the minimum bytes', ceilings, facet='l2'))"),
        ("md", "## Roofline"),
        ("code", "plots.show(plots.roofline(df, ceilings, 'Verify attention on the measured roofline'))"),
        ("md", "## Diagnosis"),
        ("code", "plots.table(df, ['variant', 'q_len', 'prefix', 'batch', 'heads', 'mode', 'l2', 'median_us',\n"
                 "                  'achieved_tflops', 'achieved_tbs', 'bound', 'fraction', 'diagnosis'])"),
    ],
    "03_ddtree_step": [
        ("md", "# The DDTree decode step\n\nThe whole loop on the engine's MLA+MoE target (random "
               "weights) with the synthetic block drafter (acceptance is a parameter; `paper` is its "
               "calibration to the DDTree paper's MATH-500 / Qwen3-8B figures). Throughput and "
               "acceptance length against budget beside greedy decoding and the single chain, then "
               "where a step's time goes. Only the systems side compares with the paper."),
        ("parameters", "preset = 'tiny'  # model preset (kdtree.engine.MODEL_PRESETS)\n"
                       "layers = 0  # override the preset's layer count (0: keep)\n"
                       "drafter = 'tiny'  # drafter preset\n"
                       "batch = 2  # sequences\n"
                       "prompt = 16  # prompt tokens\n"
                       "new = 32  # new tokens per sequence\n"
                       "budgets = [1, 4, 16]  # DDTree budgets\n"
                       "breakdown_budgets = [4]  # budgets of the step breakdown\n"
                       "accuracies = ['paper']  # drafter top-1 accuracies; paper is the calibrated drafter\n"
                       "steps = 3  # timed steps per breakdown\n" + RUN_PARAMETERS.format(name="ddtree_step")),
        ("code", "import pandas as pd\n\n"
                 "from kdtree.bench import plots\n"
                 "from kdtree.bench.ceilings import get_ceilings\n"
                 "from kdtree.bench.results import save_table\n"
                 "from kdtree.bench.engine_bench import engine_tables\n\n"
                 "ceilings = get_ceilings(ceilings_path or None, quick=True)\n"
                 "through, breakdown, meta = engine_tables(preset, layers=layers or None, drafter=drafter, batch=batch,\n"
                 "                                         prompt=prompt, new=new, budgets=budgets,\n"
                 "                                         breakdown_budgets=breakdown_budgets,\n"
                 "                                         accuracies=accuracies, steps=steps)\n"
                 "save_table(pd.concat([through.assign(table='throughput'), breakdown.assign(table='breakdown')],\n"
                 "                     ignore_index=True), results_path)\n"
                 "print(meta['device'], '| best budget:', meta['best_budget'])"),
        ("md", "## Throughput and acceptance against budget"),
        ("code", "from kdtree.engine.drafter import PAPER_MATH500_QWEN3_8B_FIGURES as paper\n\n"
                 "tree = through[through.decode == 'ddtree']\n"
                 "base = through[through.decode == 'ar']['tokens_per_s'].max()\n"
                 "# In bf16 the drafter's reference follows the decoded path; where it did not settle, tau is low.\n"
                 "unsettled = tree[~tree.self_consistent.astype(bool)]\n"
                 "if len(unsettled):\n"
                 "    print('drafter reference not settled (tau and speed underestimated):',\n"
                 "          plots.row_text(unsettled, ['accuracy', 'mode', 'budget'], named=True).tolist())\n"
                 "plots.show(plots.lines(tree, 'budget', 'tokens_per_s', ['accuracy', 'mode'], 'DDTree tokens/s',\n"
                 "                       ceilings, y_title='tokens / s', log_y=False, spread=False,\n"
                 "                       hlines={'greedy decoding': base},\n"
                 "                       note='tokens per second of the whole loop on this device, beside greedy decoding'))\n"
                 "plots.show(plots.lines(tree, 'budget', 'speedup', ['accuracy', 'mode'], 'DDTree speedup over greedy',\n"
                 "                       ceilings, y_title='x greedy', log_y=False, spread=False,\n"
                 "                       hlines={'paper, Qwen3-8B on H200': paper['speedup_ddtree']},\n"
                 "                       note=\"the same runs over greedy decoding, against the paper's end-to-end speedup\"))\n"
                 "plots.show(plots.lines(tree, 'budget', 'tau', ['accuracy', 'mode'], 'Acceptance length',\n"
                 "                       ceilings, y_title='tokens per step', log_y=False, spread=False,\n"
                 "                       hlines={'paper, chain': paper['tau_chain'],\n"
                 "                               'paper, DDTree 512': paper['tau_ddtree_512']},\n"
                 "                       note=\"tokens accepted per step: what the tree buys, independent of the device\"))\n"
                 "plots.table(through)"),
        ("md", "## Where a step's time goes"),
        ("code", "plots.breakdown_table(breakdown)"),
    ],
    "04_counters": [
        ("md", "# The models against the hardware counters\n\nEvery kernel (every verify variant, the tree "
               "build on both paths, accept, compaction) run once under Nsight Compute with the clocks left "
               "alone and every cache flushed before each kernel, its counters read from the report's raw "
               "page and put beside the launches the cost model predicts. Per call and memory level: model, "
               "counter, ratio; DRAM bytes are flagged beyond 10%, tensor FLOPs as executed beyond 5% (the "
               "other figures with a looser 25%, shown for the picture). L2 reads twice: `l2_read` as the SMs "
               "receive them (every block's own loads, what the code moves) and `l2_served` as the L2 slices "
               "serve them, after the L2 request coalescer merged identical reads that co-resident blocks "
               "issue at the same time (anywhere between the model's merged floor and the SMs' bytes). DRAM "
               "figures under 256 KB are not judged: after the flush a launch fetches its own code from DRAM. "
               "Without a GPU and ncu nothing is profiled and the notebook says so."),
        ("parameters", "counters_path = ''  # a `kdtree profile --out` folder to read; empty: profile now (GPU host)\n"
                       "full = False  # the larger point set, with 257 tree nodes too\n" + RUN_PARAMETERS.format(name="counters")),
        ("code", "from pathlib import Path\n\n"
                 "import pandas as pd\n\n"
                 "from kdtree.bench import counters, plots\n"
                 "from kdtree.bench.results import save_table\n\n"
                 "out_dir = str(Path(run_dir or 'results') / 'counters')\n"
                 "joined, ceilings, source = counters.notebook_inputs(counters_path, out_dir, full, ceilings_path)\n"
                 "table = counters.compare(joined) if joined is not None else pd.DataFrame(columns=['figure', 'counter'])\n"
                 "save_table(table, results_path)\n"
                 "print(source)"),
        ("md", "## Model against counters, per call"),
        ("code", "if joined is None:\n"
                 "    print(counters.NO_GPU)\n"
                 "else:\n"
                 "    calls = table[table['launch'] == 'all']\n"
                 "    plots.table(calls, ['kernel', 'variant', 'batch', 'q_len', 'heads', 'prefix', 'budget', 'splits', 'layout',\n"
                 "                        'kernel_name', 'figure', 'modelled', 'counter', 'ratio', 'tolerance', 'flag', 'note'])"),
        ("md", "## Targets beyond tolerance\n\nThe DRAM bytes and tensor FLOPs (as executed) that miss the "
               "model, with the counters' own explanation where they have one."),
        ("code", "if joined is not None:\n"
                 "    miss = table[table['target'].astype(bool) & (table['flag'] != '') & (table['launch'] == 'all')]\n"
                 "    print(f'{len(miss)} of {int(table[table.launch == \"all\"].target.astype(bool).sum())} target figures beyond tolerance')\n"
                 "    plots.table(miss, ['kernel', 'variant', 'figure', 'modelled', 'counter', 'ratio', 'note'])"),
        ("md", "## Per launch"),
        ("code", "if joined is not None:\n"
                 "    plots.table(joined, ['call', 'launch', 'kernel', 'variant', 'kernel_name', 'duration_us', 'dram_read',\n"
                 "                         'dram_write', 'l2_read_sm', 'l2_read', 'l2_write', 'tensor_flops', 'hmma_active_pct',\n"
                 "                         'l2_pct_peak', 'xbar_pct_peak', 'occupancy_pct', 'registers', 'smem_bytes',\n"
                 "                         'sm_clock_mhz'])"),
        ("md", "## Hierarchical roofline from counter bytes\n\nOne marker per memory level for each call, as "
               "Nsight Compute draws it: the same counted FLOP/s at the intensity of each level's bytes."),
        ("code", "if joined is not None:\n"
                 "    plots.show(counters.roofline_figure(counters.roofline_points(joined), ceilings,\n"
                 "                                        'Every profiled call: DRAM and L2 intensity from the counters'))"),
    ],
    "05_moe_verify": [
        ("md", "# The MoE wall: what a draft tree costs on Kimi K2's experts\n\nOne GPU's share of Kimi K2 "
               "under TP8 attention and EP8 experts (`kimi_k2_ep8`: 48 of 384 experts, top-8 over all 384 by a "
               "float32 router). A verify of T tree tokens touches about 48 (1 - (1 - 8/384)^T) local experts, "
               "so the expert weights streamed per layer grow with the tree. First the engine's MoE layer "
               "against T for the model's router, uniform and Zipf routing, with distinct experts, bytes, "
               "the binding roof and the diagnosis per point (graph replay; each point checked against a "
               "float64 reference first). Then the step model: measured components times the layer count, "
               "plus modelled TP/EP communication, giving DDTree's speedup over greedy decoding against "
               "budget for Kimi K2 on 8 GPUs and for a dense model of the paper's shape (Qwen3-8B, one GPU), "
               "and its validation against the engine's measured step."),
        ("parameters", "preset = 'tiny_ep'  # MoE preset of the layer benchmark (kdtree.engine.MODEL_PRESETS)\n"
                       "tokens = [1, 5, 17]  # verify tokens T per MoE call\n"
                       "routings = ['model', 'uniform', 'zipf']  # router, uniform k-subsets, Zipf popularity\n"
                       "zipf_a = 1.2  # Zipf exponent of the skewed routing\n"
                       "fp8 = False  # also time fp8 e4m3 experts (CUDA only)\n"
                       "step_models = ['tiny_ep', 'dense_tiny']  # engine preset or qwen3_8b / dense_tiny\n"
                       "step_layers = [2, 2]  # layers of each (Kimi K2: 61, Qwen3-8B: 36)\n"
                       "step_gpus = [4, 1]  # GPUs each is spread over (communication modelled)\n"
                       "batches = [1, 2]  # sequences per step\n"
                       "prefixes = [32]  # KV tokens before the tree\n"
                       "budgets = [16, 32]  # tree budgets (the paper's tau covers 16..1024)\n"
                       "drafter = 'tiny'  # drafter preset of the decode phases\n"
                       "link_gbps = 450.0  # modelled link bandwidth per GPU and direction, GB/s\n"
                       "link_latency_us = 10.0  # modelled latency per collective\n"
                       "comm = 'allreduce'  # allreduce or alltoall (see kdtree.bench.stepmodel)\n"
                       "tau_table = ''  # an engine throughput table (03_ddtree_step results); empty: the paper's tau\n"
                       "validate_presets = ['tiny_ep']  # engine presets validated (GPU: each that fits one GPU)\n"
                       "validate_layers = 2  # layers of each in the validation (the first dense one included)\n"
                       "validate_batch = 1\n"
                       "validate_budgets = [16]\n"
                       "validate_prompt = 16\n"
                       "validate_new = 16\n"
                       "validate_steps = 3  # timed engine steps per budget\n"
                       "quick = True  # fewer repetitions\n" + RUN_PARAMETERS.format(name="moe_verify")),
        ("code", "import pandas as pd\n\n"
                 "from kdtree.bench import plots, roofline, stepmodel\n"
                 "from kdtree.bench.ceilings import get_ceilings\n"
                 "from kdtree.bench.moe import moe_layer, run_moe_bench, stage_breakdown\n"
                 "from kdtree.bench.results import load_table, save_table\n\n"
                 "ceilings = get_ceilings(ceilings_path or None, quick=True)\n"
                 "if tau_table:\n"
                 "    tau, tau_chain = stepmodel.engine_tau(load_table(tau_table).query(\"table == 'throughput'\"))\n"
                 "else:\n"
                 "    tau, tau_chain = stepmodel.PAPER_TAU, stepmodel.PAPER_TAU_CHAIN\n"
                 "tau = {b: t for b, t in tau.items() if b in budgets}\n"
                 "link = stepmodel.Link(link_gbps * 1e9, link_latency_us)\n"
                 "moe = run_moe_bench(preset, tokens, routings, zipf_a=zipf_a, fp8=fp8, ceilings=ceilings,\n"
                 "                    quick=quick)"),
        ("md", "## MoE layer time and distinct experts against verify tokens"),
        ("code", "plots.show(plots.lines(moe, 'tokens', 'median_us', ['variant', 'routing'], 'MoE layer time per call',\n"
                 "                       ceilings, y_title='us'))\n"
                 "uniform = moe[moe.routing == 'uniform'].assign(routing='closed form, uniform', distinct=lambda d: d.distinct_uniform)\n"
                 "plots.show(plots.lines(pd.concat([moe, uniform]), 'tokens', 'distinct', ['variant', 'routing'],\n"
                 "                       'Distinct local experts touched', ceilings, y_title='experts', log_y=False))"),
        ("md", "## Fraction of HBM bandwidth on the distinct experts' bytes"),
        ("code", "plots.show(plots.lines(moe, 'tokens', 'hbm_fraction', ['variant', 'routing'],\n"
                 "                       'MoE: minimum bytes (distinct experts) over time, against measured HBM bandwidth',\n"
                 "                       ceilings, y_title='fraction of HBM bandwidth', log_y=False, spread=False))\n"
                 "plots.table(moe, ['variant', 'routing', 'tokens', 'distinct', 'distinct_uniform', 'local_slots', 'kernels',\n"
                 "                  'median_us', 'p20_us', 'p80_us', 'bytes_min', 'hbm_fraction', 'achieved_tflops', 'bound',\n"
                 "                  'fraction', 'diagnosis'])"),
        ("md", "## Where one MoE call's time goes\n\nEach stage of the layer's code path timed alone under "
               "the model's router (graph replay on a GPU): on a GPU the `kernels` path (`kdtree.experts`, five "
               "launches: the router in one kernel (float32 gate, sigmoid, top-k, renormalisation), one "
               "permutation kernel, gate and up of the routed experts and of the shared expert (an extra group "
               "over all tokens) in one grouped weight-streaming GEMM with the SiLU product, the down GEMM of "
               "both, a combine that adds the shared rows; the `torch` path it replaces is timed whole above as "
               "`bf16-torch`), on CPU the `torch` path (the reference). `hbm_fraction`: the weight bytes a stage "
               "streams (the distinct experts', the shared expert's, the router's float32 gate) over its time, "
               "against the measured HBM bandwidth."),
        ("code", "import torch\n\n"
                 "layer = moe_layer(stepmodel.step_config(preset), 'cuda' if torch.cuda.is_available() else 'cpu',\n"
                 "                  torch.bfloat16 if torch.cuda.is_available() else torch.float32)\n"
                 "parts, gen = [], torch.Generator().manual_seed(0)\n"
                 "for T in tokens:\n"
                 "    x = torch.randn(T, layer.w1.shape[2], generator=gen).to(layer.w1.device, layer.w1.dtype)\n"
                 "    for backend in ('auto',) if torch.cuda.is_available() else ('torch',):\n"
                 "        layer.backend = backend\n"
                 "        parts.append(stage_breakdown(layer, x, layer.route(x)[1], quick=quick))\n"
                 "layer = None\n"
                 "breakdown = pd.concat(parts, ignore_index=True)\n"
                 "breakdown['hbm_fraction'] = breakdown.weight_bytes / (breakdown.median_us * 1e-6) / ceilings.hbm_bw\n"
                 "plots.table(breakdown.pivot_table(index=['path', 'stage'], columns='tokens', values='median_us', sort=False)\n"
                 "            .round(1).reset_index())\n"
                 "plots.table(breakdown[breakdown.weight_bytes > 0].pivot_table(index=['path', 'stage'], columns='tokens',\n"
                 "                                                              values='hbm_fraction', sort=False)\n"
                 "            .round(3).reset_index())"),
        ("md", "## Step model: DDTree's speedup over greedy decoding against budget\n\nComponents measured in "
               "this run; communication modelled from the link parameters (labelled `comm`)."),
        ("code", "components, speed = [], []\n"
                 "for name, layers, gpus in zip(step_models, step_layers, step_gpus):\n"
                 "    comp = stepmodel.measure_components(name, batches, list(tau), prefixes, drafter=drafter, quick=quick,\n"
                 "                                        core=False)\n"
                 "    cfg = stepmodel.step_config(name)\n"
                 "    components.append(comp)\n"
                 "    speed.append(stepmodel.speedup_table(comp, layers=layers, first_dense=getattr(cfg, 'first_dense', 0),\n"
                 "                                         batches=batches, prefixes=prefixes, tau=tau, tau_chain=tau_chain,\n"
                 "                                         gpus=gpus, link=link, comm=comm, dim=cfg.dim,\n"
                 "                                         k=getattr(cfg, 'n_active_experts', 8), label=name))\n"
                 "components, speed = pd.concat(components, ignore_index=True), pd.concat(speed, ignore_index=True)\n"
                 "tree = speed[speed.decode == 'ddtree']\n"
                 "for name, part in tree.groupby('model', sort=False):\n"
                 "    fig = plots.lines(part, 'budget', 'speedup', ['batch', 'prefix'],\n"
                 "                      f\"{name}: predicted DDTree speedup over greedy (tau: {'engine' if tau_table else 'paper'})\",\n"
                 "                      ceilings, y_title='x greedy', log_y=False, spread=False)\n"
                 "    best = part[part.best]\n"
                 "    fig.add_scatter(x=best.budget, y=best.speedup, mode='markers', name='best budget',\n"
                 "                    marker={'symbol': 'star', 'size': 14, 'color': 'black'})\n"
                 "    plots.show(fig)\n"
                 "plots.table(stepmodel.best_budgets(speed))\n"
                 "print('\\n'.join(stepmodel.best_budget_statement(speed)))"),
        ("md", "## Where the predicted step goes (microseconds)"),
        ("code", "cols = [c for c in speed.columns if c.startswith('c_')]\n"
                 "plots.table(speed, ['model', 'batch', 'prefix', 'decode', 'budget', 'tau', 'step_us', 'speedup', *cols])"),
        ("md", "## Validation: the step model against the engine's measured step\n\nEvery preset of "
               "`validate_presets` at `validate_layers` layers, greedy decoding (budget 0) and each budget, "
               "each preset's engine built once and reused across its budgets (a preset that does not fit one "
               "GPU is listed with its `status`, not run; `seconds`: what each preset's validation cost this "
               "notebook); "
               "`within`: the prediction within 15% of the measured step. `predicted_us` takes the MoE "
               "measured on each layer's own inputs in one of the engine's verify forwards; `predicted_random_us` "
               "the components' MoE on random activations. The engine's random-weight model and synthetic drafter "
               "route tree tokens to fewer experts (`distinct_engine`) than random activations do "
               "(`distinct_random`, near the uniform closed form): the MoE's cost follows the routing. The model "
               "replays its components back to back (L2 warm); `predicted_cold_us` sums the same components each "
               "timed after an L2 flush. "
               "`measured_verify_us` (the engine's verify forward alone) against `predicted_verify_us` (its "
               "components) says whether a miss is in the forward or in the decode phases; `measured_p20_us` .. "
               "`measured_p80_us` is the measured step's spread over its replays."),
        ("code", "check = stepmodel.validate_presets(validate_presets, layers=validate_layers, batch=validate_batch,\n"
                 "                                    budgets=validate_budgets, prompt=validate_prompt, new=validate_new,\n"
                 "                                    steps=validate_steps, drafter=drafter, quick=quick, log=print)\n"
                 "save_table(pd.concat([moe.assign(table='moe'), breakdown.assign(table='breakdown'),\n"
                 "                      components.assign(table='components'), speed.assign(table='speedup'),\n"
                 "                      check.assign(table='validation')], ignore_index=True), results_path)\n"
                 "print(f\"{int(check.within.sum())} of {len(check)} predictions within 15% of the measured step\")\n"
                 "plots.table(check, ['preset', 'layers', 'batch', 'budget', 'prefix', 'timing', 'status', 'measured_us',\n"
                 "                    'measured_p20_us', 'measured_p80_us', 'predicted_us', 'ratio', 'within',\n"
                 "                    'predicted_cold_us', 'ratio_cold', 'measured_verify_us', 'predicted_verify_us',\n"
                 "                    'distinct_engine', 'predicted_random_us', 'ratio_random', 'distinct_random', 'seconds'])"),
    ],
    "99_summary": [
        ("md", "# Run summary\n\nEvery point of the run, the device ceilings, the roofline of all "
               "verify-attention points, and one diagnosis line per kernel, variant, timing mode "
               "and L2 state. `kdtree report <run-id>` executes this notebook and renders it as the "
               "run's index page."),
        ("parameters", 'run_dir = ""  # the run directory; empty: the latest run under parameterized_runs/ here or above'),
        ("code", "from kdtree.bench import plots, report\n\n"
                 "run_dir = str(report.find_run(run_dir))  # empty: the latest run of the repository\n"
                 "df, ceilings, manifest = report.load_run(run_dir)\n"
                 "print(manifest['run_id'], '|', ceilings.caption())\n"
                 "print({k: v for k, v in manifest['metadata'].items() if k != 'host'})"),
        ("md", "## Points"),
        ("code", "plots.table(report.overview(manifest))"),
        ("md", "## Ceilings"),
        ("code", "plots.table(ceilings.table())"),
        ("md", "## Roofline"),
        ("code", "if 'flops' in df and (df['flops'] > 0).any():\n"
                 "    plots.show(plots.roofline(df, ceilings, 'Every measured point on the roofline'))\n"
                 "else:\n"
                 "    print('no point with a FLOP model in this run')"),
        ("md", "## Diagnosis"),
        ("code", "plots.table(report.headline(df))"),
    ],
}


def build(name: str) -> nbformat.NotebookNode:
    """The notebook ``name`` as a clean nbformat node."""
    cells = []
    for kind, src in NOTEBOOKS[name]:
        if kind == "md":
            cells.append(new_markdown_cell(src))
        else:
            cell = new_code_cell(src)
            if kind == "parameters":
                cell.metadata["tags"] = ["parameters"]
            cells.append(cell)
    for i, cell in enumerate(cells):
        cell["id"] = f"{name[:2]}-{i:02d}"
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def write_all(folder: str | Path) -> list[Path]:
    """Write every notebook into ``folder``; returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in NOTEBOOKS:
        path = folder / f"{name}.ipynb"
        nbformat.write(build(name), str(path))
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in write_all(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent):
        print(p)
