"""Validated configuration of the memory engine.

The ROS parameters map onto these dataclasses in one place
(``videokv_node.ros.params``: a nested dataclass ``memory.streamkv`` becomes
the parameters ``memory.streamkv.*``); the library never reads ROS parameters.
The defaults are the ``robot`` preset (memory-conscious, today's node); the
``paper`` preset (``memory/presets.py``) gives each seed's own values and
mechanisms. The comments say where a value comes from, where the paper gave
none and we chose, and where ``robot`` departs from the paper.
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass, field

POLICIES = ("full", "rekv", "streamkv", "hermes", "mukv")
PRESETS = ("robot", "paper")  # memory.preset: see memory/presets.py
REKV_QUERIES = ("prompt", "question")
SIMILARITIES = ("tokens", "mean")
HERMES_PSEUDO_MODES = ("probe", "live")
HERMES_SCHEDULE_ENDS = ("last_middle", "first_deep")
QUESTION_STAGES = ("none", "tgvkv")
OPTION_SCORINGS = ("likelihood", "letter")
GRANULARITIES = ("patch", "frame", "segment")

# StreamKV's key elements of a segment (paper, "KV Compression via Guidance Prompt").
STREAMKV_GUIDANCE = (
    "Describe the key elements of this video segment: the salient entities (people, objects, locations, "
    "key visual concepts); the key events and actions (what happened, when and where); the temporal and "
    "causal relationships (how events unfold, cause and effect); the contextual cues (scene changes, "
    "dialogue, narrative shifts); and the important numbers and facts (counts, quantities, text)."
)
# HERMES replaces the unknown question by a generic one while streaming (paper 3.3, "pseudo query").
HERMES_PSEUDO_QUERY = "What is happening in the video? Describe the objects, people, actions and events."
# HERMES' public script (predict_next_question, no conversation history yet): the local query
# scores shallow layers (unused there: their recency weight is 1), the global one deep layers,
# and "local; global" (its "mixed" query) middle layers.
HERMES_LOCAL_QUERY = "Describe the current scene in detail, focusing on specific objects, fine-grained actions, and spatial relationships."
HERMES_GLOBAL_QUERY = "Summarize the video narrative, identifying main characters, key events, timeline changes, and the overall theme."


class ConfigError(ValueError):
    """A configuration that cannot work; the message says which field and why."""


def _check_fraction(prefix: str, name: str, value: float, low_open: bool = False) -> None:
    ok = (0.0 < value <= 1.0) if low_open else (0.0 <= value <= 1.0)
    if not ok:
        raise ConfigError(f"{prefix}.{name} must be in {'(0, 1]' if low_open else '[0, 1]'}, got {value}")


@dataclass(slots=True)
class ReKVConfig:
    """ReKV (the baseline; Di et al., ICLR 2025, public code Becomebright/ReKV), its question-time choices."""

    query: str = "prompt"  # retrieval query: mean over the whole prompt's tokens (robot) or the question's own tokens (paper, ReKV's code)
    question_window: bool = True  # robot: the recent frames within local_window_tokens always attended; paper (False): init tokens + top-k over all blocks

    def __post_init__(self) -> None:
        if self.query not in REKV_QUERIES:
            raise ConfigError(f"memory.rekv.query must be one of {REKV_QUERIES}, got {self.query!r}")


@dataclass(slots=True)
class StreamKVConfig:
    """StreamKV (seed 000); defaults from its experimental setup."""

    similarity_threshold: float = 0.99  # adjacent-frame cosine below this starts a segment
    similarity: str = "tokens"  # tokens: cosine of the flattened (T, D) features (Eq. 1 as written); mean: of the token means (StreamKV's code)
    min_segment_frames: int = 4  # m: the exclusion window, segments are at least this long
    max_segment_frames: int = 64  # M: beyond it the most similar adjacent pair is merged
    max_segment_s: float = 30.0  # ours: an open segment spanning longer (stamps) closes at the next frame; 0 = no cap
    summary_frames: bool = True  # a summary frame (mean of the segment) per segment, never compressed
    compression_ratio: float = 0.6  # theta: share of a segment's frame blocks dropped per layer (paper's main setting: 60%)
    retrieve_frames: int = 8  # N_r: blocks retrieved per layer on average (N = N_r x L)
    guidance_prompt: str = STREAMKV_GUIDANCE  # compression criterion (paper: key semantic elements)

    def __post_init__(self) -> None:
        p = "memory.streamkv"
        _check_fraction(p, "similarity_threshold", self.similarity_threshold)
        if self.similarity not in SIMILARITIES:
            raise ConfigError(f"{p}.similarity must be one of {SIMILARITIES}, got {self.similarity!r}")
        if self.min_segment_frames < 1 or self.max_segment_frames < self.min_segment_frames:
            raise ConfigError(f"{p}: need 1 <= min_segment_frames <= max_segment_frames")
        if not (isinstance(self.max_segment_s, (int, float)) and 0.0 <= self.max_segment_s < float("inf")):
            raise ConfigError(f"{p}.max_segment_s must be a finite number of seconds >= 0 (0: no cap), got {self.max_segment_s!r}")
        if not 0.0 <= self.compression_ratio < 1.0:
            raise ConfigError(f"{p}.compression_ratio must be in [0, 1), got {self.compression_ratio}")
        if self.retrieve_frames < 1:
            raise ConfigError(f"{p}.retrieve_frames must be >= 1")
        if not self.guidance_prompt.strip():
            raise ConfigError(f"{p}.guidance_prompt must not be empty")


@dataclass(slots=True)
class HermesConfig:
    """HERMES (seed 002). The notes we have lost the paper's formulas; values marked 'ours' are our choices."""

    shallow_ratio: float = 0.1  # share of layers that are sensory memory (paper: 10% shallow / 60% middle / 30% deep)
    deep_ratio: float = 0.3  # share of layers that are long-term memory
    recency_rate: float = 20.0  # forgetting curve exp(-rate * age / oldest age), as HERMES' public script (exp(-20 d / (N-1)))
    recency_rate_deep: float = 20.0  # middle layers' rate moves linearly from recency_rate to this (script: 20 -> 0.5; robot: fixed 20)
    omega0: float = 1.0  # middle-layer recency weight at the shallow boundary (ours; script 1.0)
    omega_gamma: float = 1.0  # its decrease to the deep boundary: omega = omega0 - gamma * depth (ours; script 0.9)
    schedule_end: str = "last_middle"  # where depth reaches 1: the last middle layer (ours) or the first deep one (script)
    smoothing_shallow: float = 0.1  # lambda of cross-layer smoothing s_l <- (1-lambda) s_l + lambda s_{l+1},
    smoothing_middle: float = 0.3  #   per layer role, from HERMES' public script
    smoothing_deep: float = 0.4
    chunk_frames: int = 16  # frames between compressions (paper: the stream is encoded in chunks of 16 frames)
    summary_token: bool = True  # pruned deep-layer tokens folded into one summary token per layer
    reindex: str = "lazy"  # lazy (streaming, paper's choice for streams) or eager (offline)
    reindex_at: float = 0.9  # lazy: re-index when positions pass this share of the model's maximum (ours)
    pseudo_query: str = HERMES_PSEUDO_QUERY  # probe mode: one generic question scoring deep and middle layers
    pseudo_queries: str = "probe"  # probe: pseudo_query read once after the sink (ours); live: local/global/mixed run over the live cache (script)
    local_query: str = HERMES_LOCAL_QUERY  # live mode: with global_query, the "mixed" query of middle layers ("local; global")
    global_query: str = HERMES_GLOBAL_QUERY  # live mode: the query of deep layers

    def __post_init__(self) -> None:
        p = "memory.hermes"
        _check_fraction(p, "shallow_ratio", self.shallow_ratio)
        _check_fraction(p, "deep_ratio", self.deep_ratio)
        if self.shallow_ratio + self.deep_ratio > 1.0:
            raise ConfigError(f"{p}: shallow_ratio + deep_ratio must be <= 1")
        if self.recency_rate <= 0 or self.recency_rate_deep <= 0:
            raise ConfigError(f"{p}.recency_rate and recency_rate_deep must be > 0")
        if self.schedule_end not in HERMES_SCHEDULE_ENDS:
            raise ConfigError(f"{p}.schedule_end must be one of {HERMES_SCHEDULE_ENDS}, got {self.schedule_end!r}")
        if self.pseudo_queries not in HERMES_PSEUDO_MODES:
            raise ConfigError(f"{p}.pseudo_queries must be one of {HERMES_PSEUDO_MODES}, got {self.pseudo_queries!r}")
        if self.chunk_frames < 1:
            raise ConfigError(f"{p}.chunk_frames must be >= 1")
        for role in ("shallow", "middle", "deep"):
            _check_fraction(p, f"smoothing_{role}", getattr(self, f"smoothing_{role}"))
        _check_fraction(p, "reindex_at", self.reindex_at, low_open=True)
        if self.reindex not in ("lazy", "eager"):
            raise ConfigError(f"{p}.reindex must be lazy or eager, got {self.reindex!r}")
        for name in ("pseudo_query", "local_query", "global_query"):
            if not getattr(self, name).strip():
                raise ConfigError(f"{p}.{name} must not be empty")


@dataclass(slots=True)
class MuKVConfig:
    """MuKV (seed 001); defaults from the paper's main setting (LLaVA-OV: 49 / 196 / 784 tokens)."""

    granularities: tuple[str, ...] = GRANULARITIES  # which memories are built
    patch_split: int = 4  # a patch block is 1/patch_split of a frame's tokens (196 / 4 = 49)
    segment_frames: int = 4  # a segment block is this many frames (4 x 196 = 784)
    alpha_patch: float = 0.5  # weight of attention vs FFT energy in compression
    alpha_frame: float = 0.7
    alpha_segment: float = 0.8
    keep_patch: float = 0.1  # rho: share of a block's tokens kept
    keep_frame: float = 0.1
    keep_segment: float = 0.8
    retrieve_patch: int = 20  # k_g: blocks retrieved per granularity (total 64)
    retrieve_frame: int = 32
    retrieve_segment: int = 12
    rerank_patch: float = 0.3  # lambda_g: weight of consistency with the top segments
    rerank_frame: float = 0.3
    rerank_segment: float = 0.0
    top_segments: int = 5  # segment candidates whose mean is the rerank centroid
    over_retrieval: int = 2  # stage 1 keeps over_retrieval x k_g candidates

    def __post_init__(self) -> None:
        p = "memory.mukv"
        self.granularities = tuple(g for g in self.granularities if g)
        if not self.granularities or any(g not in GRANULARITIES for g in self.granularities):
            raise ConfigError(f"{p}.granularities must be a non-empty subset of {GRANULARITIES}, got {self.granularities}")
        if self.patch_split < 1 or self.segment_frames < 1 or self.top_segments < 1 or self.over_retrieval < 1:
            raise ConfigError(f"{p}: patch_split, segment_frames, top_segments and over_retrieval must be >= 1")
        for g in GRANULARITIES:
            _check_fraction(p, f"alpha_{g}", getattr(self, f"alpha_{g}"))
            _check_fraction(p, f"keep_{g}", getattr(self, f"keep_{g}"), low_open=True)
            _check_fraction(p, f"rerank_{g}", getattr(self, f"rerank_{g}"))
            if getattr(self, f"retrieve_{g}") < 0:
                raise ConfigError(f"{p}.retrieve_{g} must be >= 0")


@dataclass(slots=True)
class TGVKVConfig:
    """TGV-KV (seed 004), the question-time stage."""

    keep_ratio: float = 0.05  # share of the assembled context's KV kept for decoding (paper's headline: 5%)

    def __post_init__(self) -> None:
        _check_fraction("memory.tgvkv", "keep_ratio", self.keep_ratio, low_open=True)


@dataclass(slots=True)
class MemoryConfig:
    """The memory engine's configuration. Defaults are the ``robot`` preset; ``presets.preset_memory_config``
    builds the ``paper`` one (a value given explicitly wins over the preset's)."""

    policy: str = "rekv"  # one of POLICIES; chosen at start, never changed at run time
    preset: str = "robot"  # robot or paper: which defaults the other fields were given (memory/presets.py); recorded, never read by policies
    question_stage: str = "none"  # none or tgvkv: eviction of the assembled context after the question's prefill
    budget_tokens: int = 16384  # cap on KV tokens resident on the model's device, prompt sink included (per layer)
    offload_bytes: int = 1 << 30  # cap on host RAM for offloaded KV blocks, allocated once at start
    local_window_tokens: int = 2048  # tokens of recent frames each new frame attends to while encoding
    retrieve_frames: int = 8  # rekv: frame blocks retrieved per layer for a question (besides the recent ones)
    page_tokens: int = 4  # host arena allocation unit, in tokens: divides 196 (LLaVA-OV) and 16 (tiny) exactly
    max_question_tokens: int = 512  # longer questions are refused
    snapshot_dir: str = ""  # where ~/save_memory and ~/load_memory read and write; "" = snapshots disabled
    snapshot_on_shutdown: str = ""  # snapshot name written when the node shuts down cleanly; "" = none
    restore_on_start: str = ""  # snapshot name loaded at start if it exists; "latest": the newest good periodic one; "" = start empty
    snapshot_period_s: float = 0.0  # a periodic snapshot into snapshot_dir every this many seconds (node clock); 0 = off
    snapshot_keep: int = 3  # periodic snapshots kept (the newest); older ones are deleted after each good write
    rekv: ReKVConfig = field(default_factory=ReKVConfig)
    streamkv: StreamKVConfig = field(default_factory=StreamKVConfig)
    hermes: HermesConfig = field(default_factory=HermesConfig)
    mukv: MuKVConfig = field(default_factory=MuKVConfig)
    tgvkv: TGVKVConfig = field(default_factory=TGVKVConfig)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"memory.policy must be one of {POLICIES}, got {self.policy!r}")
        if self.preset not in PRESETS:
            raise ConfigError(f"memory.preset must be one of {PRESETS}, got {self.preset!r}")
        if self.question_stage not in QUESTION_STAGES:
            raise ConfigError(f"memory.question_stage must be one of {QUESTION_STAGES}, got {self.question_stage!r}")
        for name in ("budget_tokens", "local_window_tokens", "page_tokens", "max_question_tokens"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"memory.{name} must be > 0, got {getattr(self, name)}")
        if self.offload_bytes < 0:
            raise ConfigError(f"memory.offload_bytes must be >= 0, got {self.offload_bytes}")
        if self.retrieve_frames < 0:
            raise ConfigError(f"memory.retrieve_frames must be >= 0, got {self.retrieve_frames}")
        if (self.snapshot_on_shutdown or self.restore_on_start or self.snapshot_period_s > 0) and not self.snapshot_dir:
            raise ConfigError("memory.snapshot_on_shutdown, memory.restore_on_start and memory.snapshot_period_s need memory.snapshot_dir")
        if self.snapshot_period_s < 0 or self.snapshot_keep < 1:
            raise ConfigError(f"need memory.snapshot_period_s >= 0 (0: off) and memory.snapshot_keep >= 1, got "
                              f"{self.snapshot_period_s} and {self.snapshot_keep}")
        if self.local_window_tokens >= self.budget_tokens:
            raise ConfigError(
                f"memory.local_window_tokens ({self.local_window_tokens}) must be smaller than "
                f"memory.budget_tokens ({self.budget_tokens}): the window is part of the resident budget"
            )


@dataclass(frozen=True, slots=True)
class AnswerConfig:
    """How an answer is read from the model (ROS parameters ``answer.*``)."""

    # How a multiple-choice question picks its option (VideoMemoryEngine.ask):
    # likelihood: each option's text scored as the answer to the open question, by its mean
    #   log-probability per token, on one cached question context; scores = softmax of those means.
    # letter: the options listed as "A. ..." in the prompt, scores = softmax of the letters' logits
    #   (what instruction-following Video-LLMs are evaluated with; videokv-tiny v2 read it at chance).
    option_scoring: str = "likelihood"

    def __post_init__(self) -> None:
        if self.option_scoring not in OPTION_SCORINGS:
            raise ConfigError(f"answer.option_scoring must be one of {OPTION_SCORINGS}, got {self.option_scoring!r}")


@dataclass(slots=True)
class GenerationConfig:
    max_new_tokens: int = 64  # default answer length when a request gives 0
    max_new_tokens_limit: int = 1024  # a request asking for more is refused
    answer: AnswerConfig = field(default_factory=AnswerConfig)  # ROS parameters answer.*

    def __post_init__(self) -> None:
        if not 0 < self.max_new_tokens <= self.max_new_tokens_limit:
            raise ConfigError(
                f"max_new_tokens must be in [1, {self.max_new_tokens_limit}], got {self.max_new_tokens}"
            )


def fit_to_model(memory: MemoryConfig, tokens_per_frame: int) -> tuple[MemoryConfig, list[str]]:
    """``memory`` with the policy defaults that cannot hold for a model of ``tokens_per_frame`` adapted,
    and a sentence per adaptation (the node logs them); a value set away from its default that cannot
    hold raises ConfigError naming the values that would.

    Today one case: MuKV's patch blocks split a frame's tokens in ``patch_split`` equal runs. The
    paper's 4 fits LLaVA-OneVision's 196 tokens; videokv-tiny has 6, so the default becomes the
    largest divisor of the frame's tokens not above it (3: patch blocks of 2 tokens).
    """
    mukv = memory.mukv
    if memory.policy != "mukv" or "patch" not in mukv.granularities or tokens_per_frame % mukv.patch_split == 0:
        return memory, []
    default = MuKVConfig().patch_split
    divisors = [d for d in range(1, tokens_per_frame + 1) if tokens_per_frame % d == 0]
    if mukv.patch_split != default:
        raise ConfigError(f"memory.mukv.patch_split ({mukv.patch_split}) must divide the {tokens_per_frame} tokens of a frame "
                          f"of this model: one of {divisors}")
    split = max(d for d in divisors if d <= default)
    fitted = dataclasses.replace(memory, mukv=dataclasses.replace(mukv, patch_split=split))
    return fitted, [f"memory.mukv.patch_split: the default {default} does not divide the {tokens_per_frame} tokens of a frame "
                    f"of this model; using {split} (patch blocks of {tokens_per_frame // split} tokens)"]
