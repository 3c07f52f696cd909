"""MLPerf Storage v2.0's checkpoint workload: its four Llama 3 models, the TP x PP x DP layout of
each, and the bytes each rank writes, computed as its reference tool (DLIO) computes them. No
torch here: a config names a preset, and sizing one must stay cheap.

Sources (every figure below is one of these, or follows from them by DLIO's own arithmetic):

- [W] mlcommons/storage, branch v2.0-branch (commit 0bfbd3aa4772643193db403b86e50300372bc226),
  configs/dlio/workload/llama3_{8b,70b,405b,1t}.yaml: num_layers, hidden_size, ffn_hidden_size,
  num_attention_heads, num_kv_heads, vocab_size, parallelism tensor / pipeline / zero_stage,
  model_datatype fp16, optimizer_datatype fp32, num_checkpoints_write 10, num_checkpoints_read
  10, fsync True.
- [R] the same commit, Submission_guidelines.md section 2.2 (lines 93-209): Table 2 (TPxPPxDP
  1x1x8, 8x1x8, 8x32x2, 8x64x2; ZeRO 3, 3, 1, 1; checkpoint size 105 GB, 912 GB, 5.29 TB,
  18 TB), subset mode ("writing/reading only a fraction (num_gpus/TP/PP/DP) of the checkpoint
  data", line 119), the order ("first perform the checkpoint write, then clear the cache, and
  finally perform the checkpoint read", line 123), duration = the maximum across GPUs (line 188).
- [C] the same commit, mlpstorage/config.py lines 67-73: 8 processes in subset mode
  (LLM_SUBSET_PROCS), and the data parallelism mlpstorage passes in subset mode (closed GPU
  count / GPUs per data-parallel instance: 8, 8, 2, 2; mlpstorage/benchmarks/dlio.py lines
  259-266).
- [M] the same commit, mlpstorage/utils.py generate_mpi_prefix_cmd (lines 329-362): across
  hosts, `mpirun -n N -host h0:s,h1:s,...` with the processes split evenly over the hosts
  (line 347); MPI places ranks by slot, host 0 first: host h runs ranks h x s to h x s + s - 1.
  Submission_guidelines.md lines 97 and 117: `default` mode runs the whole layout (TP x PP x DP
  ranks) across as many hosts as it takes, each with at least 4 GPUs in CLOSED; lines 188-189:
  a checkpoint's duration is the maximum across all GPUs, its throughput the minimum.
- [D] argonne-lcf/dlio_benchmark, branch mlperf_storage_v2.0 (the pin of [W]'s pyproject.toml
  line 15; commit 392621b230472c4206e4299ece689700e07544a4),
  dlio_benchmark/checkpointing/base_checkpointing.py: ranks in TP, then PP, then DP order
  (lines 64-67); parameters (get_num_parameters, lines 284-302); a rank's layer tensors, fp16,
  divided by TP and, with ZeRO-3, by DP (get_layer_parameters, lines 304-329); its layers
  (get_layer_index, lines 360-382: layer 0 the embedding on the first stage, layers L+1 and
  L+2 the head and final norm on the last); with ZeRO-1 only data-parallel rank 0 holds model
  states (lines 123-125); the optimizer states, fp32, on every rank: three of P / (DP x TP x PP)
  and three of 5 x hidden (get_optimization_groups, lines 340-358); sizes in 1024^3 units
  (lines 164-165); the files, one torch.save of the model states and one of the optimizer
  states a rank (save_checkpoint, lines 385-418; pytorch_checkpointing.py save_state, lines
  131-137); dlio_benchmark/utils/utility.py DLIOMPI.initialize (lines 160-187): a rank's node is
  found from each node's process count, nodes holding consecutive ranks (offsets, line 182), and
  a rank's shard depends on its global rank alone (base_checkpointing.py lines 64-67).

With ZeRO-3 a rank's bytes come to about 14 x P / (TP x DP): fp16 weights (2 bytes) and three
fp32 optimizer tensors (12 bytes) of its share. DLIO's sum over all ranks gives 104.70 GiB (8B),
911.21 GiB (70B) and 5,292.25 GiB (405B): the rules' 105 GB, 912 GB and 5.29 TB, which count
1024^3 bytes a "GB" (as DLIO prints them) and a thousand of those a "TB".
For 1T it gives 15,426.59 GiB where the rules' table says 18 TB: mlpstorage's own estimate
(mlpstorage/config.py lines 77-79, LLM_SIZE_BY_RANK, "These need to be updated with actual
values") is 2,571 + 15,426 GB; the bytes here are what DLIO writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.common.errors import UserError

HOST_PROCS = 8  # [C] LLM_SUBSET_PROCS: the ranks of one host in subset mode
CHECKPOINTS = 10  # [W] num_checkpoints_write and num_checkpoints_read
MODEL_ITEM = 2  # [W] model_datatype fp16
OPTIM_ITEM = 4  # [W] optimizer_datatype fp32


@dataclass(frozen=True)
class MlperfModel:
    """One model of [W] and [R] Table 2, with the checkpoint size the rules publish."""

    name: str
    num_layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    tp: int
    pp: int
    dp: int
    zero: int
    published: str  # [R] Table 2's checkpoint size, as printed

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp


# Each line from [W] configs/dlio/workload/llama3_NAME.yaml at v2.0-branch 0bfbd3aa: num_layers
# (line 4; 1t: 5), hidden_size, ffn_hidden_size, num_attention_heads, num_kv_heads, vocab_size
# (transformer:, lines 12-16; 1t: 13-17), tensor and pipeline (lines 8-9; 1t: 9-10), zero_stage
# (line 10; 1t: 11); dp from [R] Table 2 (Submission_guidelines.md line 107) and [C]
# (LLM_ALLOWED_VALUES, mlpstorage/config.py lines 69-73: closed GPUs / GPUs per DP instance);
# the published size from [R] Table 2, line 109.
MODELS: dict[str, MlperfModel] = {
    "llama3-8b": MlperfModel("llama3-8b", 32, 4096, 14336, 32, 8, 128256, 1, 1, 8, 3, "105 GB"),
    "llama3-70b": MlperfModel("llama3-70b", 80, 8192, 28672, 128, 8, 128256, 8, 1, 8, 3, "912 GB"),
    "llama3-405b": MlperfModel(
        "llama3-405b", 126, 16384, 53248, 128, 8, 128256, 8, 32, 2, 1, "5.29 TB"
    ),
    "llama3-1t": MlperfModel("llama3-1t", 128, 25872, 98304, 192, 32, 128256, 8, 64, 2, 1, "18 TB"),
}


# Where DLIO's bytes and the rules' published size part (see the module).
NOTES = {
    "llama3-1t": "that is mlpstorage's own estimate, 2,571 + 15,426 GB (mlpstorage/config.py "
    "lines 77-79: 'These need to be updated with actual values'); DLIO writes 15,426.59 GiB "
    "for this layout",
}


def model(name: str) -> MlperfModel:
    """The preset of this name; a UserError naming the known ones otherwise."""
    if name not in MODELS:
        raise UserError(f"mlperf.preset: unknown {name!r} (known: {', '.join(MODELS)})")
    return MODELS[name]


def num_parameters(m: MlperfModel) -> int:
    """[D] get_num_parameters: embedding, L x (norms, QKV, O, gated MLP), final norm, head."""
    h = m.hidden
    dim_kv = h // m.heads * m.kv_heads
    emb = m.vocab * h
    layer = h + h * (h + 2 * dim_kv) + h * h + h + 2 * m.ffn * h + m.ffn * h
    return emb + layer * m.num_layers + h + emb


def _layer_elems(m: MlperfModel, i: int) -> list[int]:
    """[D] get_layer_parameters: the elements of layer i's tensors on one rank."""
    s = m.dp if m.zero >= 3 else 1
    h, tp = m.hidden, m.tp
    dim_kv = h // m.heads * m.kv_heads
    if i in (0, m.num_layers + 1):
        return [h * m.vocab // tp // s]
    if i == m.num_layers + 2:
        return [h // s]
    return [
        h // s,
        h * (h + 2 * dim_kv) // tp // s,
        h * h // tp // s,
        h // s,
        h * 2 * m.ffn // tp // s,
        h * m.ffn // tp // s,
    ]


def _layers(m: MlperfModel, stage: int) -> range:
    """[D] get_layer_index: the layers of pipeline stage `stage` (inclusive of both ends there)."""
    per, rem = divmod(m.num_layers, m.pp)
    if stage < rem:
        lo = stage * (per + 1) + 1
        hi = lo + per
    else:
        lo = rem * (per + 1) + (stage - rem) * per + 1
        hi = lo + per - 1
    if stage == m.pp - 1:
        hi = m.num_layers + 2
    if stage == 0:
        lo = 0
    return range(lo, hi + 1)


@dataclass(frozen=True)
class RankShard:
    """What one rank writes: its model-state tensors (fp16 elements, by layer) and its
    optimizer-state tensors (fp32 elements), as DLIO sizes them."""

    rank: int
    model: tuple[tuple[int, ...], ...]  # one tuple of tensor elements per layer it holds
    optim: tuple[int, ...]

    @property
    def model_bytes(self) -> int:
        return sum(sum(layer) for layer in self.model) * MODEL_ITEM

    @property
    def optim_bytes(self) -> int:
        return sum(self.optim) * OPTIM_ITEM

    @property
    def nbytes(self) -> int:
        return self.model_bytes + self.optim_bytes


def rank_shard(m: MlperfModel, rank: int) -> RankShard:
    """Rank `rank`'s shard ([D]: tensor rank fastest, then pipeline stage, then data rank)."""
    if not 0 <= rank < m.world:
        raise UserError(f"{m.name}: rank {rank} is outside its {m.world} ranks")
    stage = (rank // m.tp) % m.pp
    dp_rank = rank // (m.tp * m.pp)
    layers: tuple[tuple[int, ...], ...] = ()
    if not (m.zero == 1 and dp_rank != 0):  # [D] lines 123-125: ZeRO-1 keeps them on DP rank 0
        layers = tuple(tuple(_layer_elems(m, i)) for i in _layers(m, stage))
    n = num_parameters(m) // m.world  # zero stage > 0: sharded over every rank
    optim = (n, m.hidden * 5) * 3
    return RankShard(rank, layers, optim)


def total_bytes(m: MlperfModel) -> int:
    """The whole checkpoint, every rank's shard (DLIO's `Total checkpoint size`)."""
    return sum(rank_shard(m, r).nbytes for r in range(m.world))


def job_ranks(m: MlperfModel, procs: int = HOST_PROCS, hosts: int = 1) -> list[int]:
    """The ranks a job of `hosts` hosts of `procs` GPUs runs: the first hosts x procs of the
    layout, or all of them when the model has no more ([R] line 119 and [M]: `subset` mode
    when fewer than TP x PP x DP, else `default`)."""
    return list(range(min(procs * hosts, m.world)))


def host_ranks(m: MlperfModel, procs: int = HOST_PROCS, host: int = 0) -> list[int]:
    """The ranks host `host` runs ([M]: consecutive, host 0 first, `procs` each; the first
    `procs` of the layout on one host in subset mode, [R] line 119, [C])."""
    return list(range(min(host * procs, m.world), min((host + 1) * procs, m.world)))


def host_bytes(m: MlperfModel, procs: int = HOST_PROCS, host: int = 0) -> int:
    """Host `host`'s share: the bytes of its ranks (what DLIO's size line says in subset mode)."""
    return sum(rank_shard(m, r).nbytes for r in host_ranks(m, procs, host))


def mode(m: MlperfModel, ranks: int) -> str:
    """MLPerf's checkpoint mode of a job of `ranks` ranks ([R] lines 117-119; mlpstorage sets
    `subset` when fewer processes than the layout's, benchmarks/dlio.py line 264)."""
    return "subset" if ranks < m.world else "default"


def scaled_shard(shard: RankShard, scale: float) -> RankShard:
    """The shard at `scale`: every tensor's elements times `scale` (at least one), so that the
    scaled run keeps DLIO's tensors and files, and its bytes are that fraction of the rank's."""
    if scale == 1:
        return shard

    def s(n: int) -> int:
        return max(1, int(n * scale))

    return RankShard(
        shard.rank,
        tuple(tuple(s(n) for n in layer) for layer in shard.model),
        tuple(s(n) for n in shard.optim),
    )


def shard_at(name: str, rank: int, scale: float) -> RankShard:
    """Rank `rank`'s shard of preset `name` at `scale`."""
    return scaled_shard(rank_shard(model(name), rank), scale)
