"""core/ranks.py: one RankLayout for the launcher (torch-free) and the workers."""

import subprocess
import sys

from grpo_tune.core.config import RunConfig
from grpo_tune.core.specs import load_hardware, load_model
from grpo_tune.core.strategy import Cluster, Strategy, Workload, validate
from grpo_tune.core.ranks import RankLayout, layout


def test_launcher_layout_carries_placement_and_degrees():
    m = load_model("tiny")
    s = validate(m, Strategy.of(tp=2, pp=2), 8)
    cfg = RunConfig(
        model=m,
        hardware=load_hardware("cpu"),
        cluster=Cluster(gpus=8, gpus_per_node=4),
        strategy=s,
        workload=Workload(prompts=8, n=2, mini_batch=4, prompt_len=8, response_len=8),
    )
    lay = layout(cfg)
    assert (lay.world_size, lay.nnodes, lay.nproc_per_node) == (8, 2, 4)
    assert (lay.tp, lay.pp, lay.dp, lay.rank) == (2, 2, 2, 0)
    assert lay.tp * lay.pp * lay.cp * lay.dp == lay.world_size
    assert layout(cfg, nnodes=1).nproc_per_node == 8


def test_one_layout_type_and_it_is_torch_free():
    import grpo_tune.trainer.launch as L
    import grpo_tune.trainer.parallel as P

    assert L.RankLayout is RankLayout and P.RankLayout is RankLayout
    code = "import sys, grpo_tune.trainer.launch, grpo_tune.core.ranks; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    assert RankLayout(world_size=4, pp=2, pp_rank=1).is_last_stage
    assert RankLayout(world_size=4, nnodes=2).nproc_per_node == 2
