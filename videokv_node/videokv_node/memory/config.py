"""Validated configuration of the memory engine.

Each field's meaning and ROS range are written next to it (``param``, ``config_base.py``); the
node's parameters, config/memory.yaml's check and docs/PARAMETERS.md are read from there
(``videokv_node/settings.py``: a nested dataclass ``memory.streamkv`` becomes the parameters
``memory.streamkv.*``); the library never reads ROS parameters. The defaults are the ``robot``
preset (memory-conscious, today's node); the ``paper`` preset (``memory/records/presets.py``) gives each
seed's own values and mechanisms. The descriptions and comments say where a value comes from,
where the paper gave none and we chose, and where ``robot`` departs from the paper.

The memory policies are declared here, and only here, with their hyper-parameters' dataclass
(``policy_config``): ``POLICIES``, ``MemoryConfig``'s sections (checked at import), the node's parameters
and the docs follow that declaration, and the factory finds the class of a policy ``<name>`` in
``memory/policies/<name>.py`` (``memory/policies/factory.py``): the one registry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from videokv_node.config_base import ConfigError, check_choice, check_fraction, param  # noqa: F401 (ConfigError: re-exported)
from videokv_node.memory.records.still_config import RedundancyConfig

PRESETS = ("robot", "paper")  # memory.preset: see memory/records/presets.py
REKV_QUERIES, REKV_SELECTIONS = ("prompt", "question"), ("layer", "shared")
SIMILARITIES, SPLITS = ("tokens", "mean"), ("softmax", "code")
HERMES_PSEUDO_MODES, HERMES_SCHEDULE_ENDS = ("probe", "live"), ("last_middle", "first_deep")
HERMES_BUDGET_RULES, HERMES_RECENCY, HERMES_REINDEX = ("hard_cap", "script"), ("frame", "token"), ("lazy", "eager")
QUESTION_STAGES = ("none", "tgvkv")
OPTION_SCORINGS = ("likelihood", "letter")  # how a multiple-choice question is read: the one list (engine, node, Spava, eval)
DEFAULT_OPTION_SCORING = OPTION_SCORINGS[0]  # answer.option_scoring's default, and a Spava question's without one
GRANULARITIES = ("patch", "frame", "segment")
DEFAULT_WINDOW_FRAMES = 8  # memory.local_window_tokens' default in frames (issue 43: chosen on the hour, docs/bench/hour.md)
DEFAULT_WINDOW_TOKENS = DEFAULT_WINDOW_FRAMES * 12  # ... in tokens: videokv-tiny's 12-token frames (records/model_fit.py)

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


# The memory policies in declaration order, each with the dataclass of its hyper-parameters (the
# parameters memory.<name>.*), or None for a policy without any. Filled by ``declare_policy`` and
# ``policy_config`` below only; the class of a policy <name> is memory/policies/<name>.py's (``factory.policy_class``).
POLICY_CONFIGS: dict[str, type | None] = {}


def declare_policy(name: str, config: type | None = None) -> None:
    """Declare the memory policy ``name`` and its hyper-parameters' dataclass (None: it has none); once per name."""
    if name in POLICY_CONFIGS:
        raise ValueError(f"memory policy {name!r} declared twice")
    POLICY_CONFIGS[name] = config


def policy_config(name: str) -> Callable[[type], type]:
    """Class decorator: the dataclass is the hyper-parameters of the memory policy ``name``."""

    def decorate(cls: type) -> type:
        declare_policy(name, cls)
        return cls

    return decorate


declare_policy("full")  # keeps every frame until the budget, then evicts the oldest: nothing to configure


@policy_config("rekv")
@dataclass(slots=True)
class ReKVConfig:
    """ReKV (the baseline; Di et al., ICLR 2025, code Becomebright/ReKV), its question-time choices; its retrieval count and window are MemoryConfig's."""

    query: str = param("prompt", "ReKV: retrieval query, the mean over the whole prompt's tokens (prompt) or the question's own tokens (question, ReKV's code)", choices=REKV_QUERIES)
    question_window: bool = param(True, "ReKV: a question always attends the recent frames within local_window_tokens besides the retrieved ones (ReKV: off, init tokens + top-k over all blocks)")
    selection: str = param("shared", "ReKV: each layer retrieves its own top-k inside the question's pass (layer, ReKV's, the paper preset) or one top-k for all layers, the layers' rankings of the question probe fused (shared, ours, robot: docs/POLICIES.md)", choices=REKV_SELECTIONS)
    rerank: int = param(0, "ReKV, selection shared (ours, not ReKV's): the fused ranking's best N x retrieve_frames blocks are shortlisted, its first rerank_keep of retrieve_frames kept and the rest chosen by the question's likelihood about each block alone (as ~/locate re-ranks, with answer.locate_prompt); 0: off", zero_ok=True)
    rerank_keep: float = param(0.5, "ReKV re-ranking: the share of retrieve_frames taken in the fused ranking's order before the likelihood chooses the rest", fraction=True)
    contrast: int = param(0, "ReKV, selection shared and ~/locate (ours, not ReKV's): score each block's mean key less the mean of its w neighbours on each side in time (same camera), so what a frame shares with its shot cancels; 0: off, ReKV's mean key", zero_ok=True)
    words: float = param(0.5, "ReKV (ours, not ReKV's): up to this share of retrieve_frames (rounded up) goes to the blocks whose words (a model's own: videokv-tiny v5's nouns) the question names, the rest retrieved as ReKV does; 0: off", fraction=True)

    def __post_init__(self) -> None:
        check_choice("memory.rekv.query", self.query, REKV_QUERIES)
        check_choice("memory.rekv.selection", self.selection, REKV_SELECTIONS)
        if min(self.rerank, self.contrast) < 0:
            raise ConfigError(f"memory.rekv.rerank and memory.rekv.contrast must be >= 0 (0: off), got {self.rerank} and {self.contrast}")
        for name in ("rerank_keep", "words"):
            check_fraction("memory.rekv", name, getattr(self, name))


@policy_config("streamkv")
@dataclass(slots=True)
class StreamKVConfig:
    """StreamKV (seed 000); defaults from its experimental setup."""

    similarity_threshold: float = param(0.99, "StreamKV: adjacent-frame cosine below this starts a segment (paper: 0.99)", fraction=True)
    similarity: str = param("tokens", "StreamKV: adjacent-frame similarity, cosine of the flattened token features (tokens, Eq. 1 as printed) or of their means (mean, StreamKV's code)", choices=SIMILARITIES)  # tokens: the (T, D) features flattened
    min_segment_frames: int = param(4, "StreamKV m: segments are at least this many frames (paper: 4)")  # the exclusion window
    max_segment_frames: int = param(64, "StreamKV M: longer segments merge their most similar adjacent pair (paper: 64)")
    max_segment_s: float = param(30.0, "StreamKV: an open segment spanning longer than this (stamps) closes at the next frame; 0: no cap (robot: 30, ours; paper: 0, segments close by similarity and merge past M)")
    summary_frames: bool = param(True, "StreamKV: a summary frame (segment mean) per segment, never compressed (paper: on)")
    compression_ratio: float = param(0.6, "StreamKV theta: share of a segment's frame blocks dropped per layer, in [0, 1) (paper: 0.6)", fraction=True)
    retrieve_frames: int = param(8, "StreamKV N_r: frame blocks retrieved per layer on average (paper: 8)")  # N = N_r x L over all layers
    split: str = param("softmax", "StreamKV: the layer budgets, softmax (Eqs. 5-8 as printed, exactly N) or code (StreamKV's code: scores standardised per layer, counts rescaled into [1-t, 1+t] x their mean, t = 0.75 compressing, 0.25 retrieving)", choices=SPLITS)
    guidance_prompt: str = param(STREAMKV_GUIDANCE, "StreamKV: guidance prompt scoring blocks for compression (paper: its key semantic elements)")

    def __post_init__(self) -> None:
        p = "memory.streamkv"
        check_fraction(p, "similarity_threshold", self.similarity_threshold)
        for name, choices in (("similarity", SIMILARITIES), ("split", SPLITS)):
            check_choice(f"{p}.{name}", getattr(self, name), choices)
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


@policy_config("hermes")
@dataclass(slots=True)
class HermesConfig:
    """HERMES (seed 002). The notes we have lost the paper's formulas; values marked 'ours' are our choices."""

    shallow_ratio: float = param(0.1, "HERMES: share of layers that are sensory memory (paper: 0.1)", fraction=True)  # paper: 10% shallow / 60% middle / 30% deep
    deep_ratio: float = param(0.3, "HERMES: share of layers that are long-term memory (paper: 0.3)", fraction=True)
    recency_rate: float = param(20.0, "HERMES: forgetting curve exp(-rate * age / oldest age), age as memory.hermes.recency measures it (HERMES' public script: 20)")
    recency: str = param("frame", "HERMES: a token's age for the forgetting curve, frame (frames since its frame, robot, ours) or token (its place from the end of the layer's cache, HERMES' script: exp(-k (N-1-j) / (N-1)))", choices=HERMES_RECENCY)
    budget_rule: str = param("hard_cap", "HERMES: hard_cap (robot, ours: budget_tokens per layer, prompt sink included, never exceeded; a compression leaves room for the next chunk) or script (HERMES' script: a compression at a chunk's end keeps budget_tokens video tokens per layer, the sink not counted, and the next chunk goes above it)", choices=HERMES_BUDGET_RULES)
    recency_rate_deep: float = param(20.0, "HERMES: the middle layers' forgetting rate moves linearly from recency_rate to this at the deep end (HERMES' script: 0.5; robot: 20, fixed)")
    omega0: float = param(1.0, "HERMES: middle-layer recency weight at the shallow boundary; omega is clamped to [0, 1] (ours: 1.0)", unbounded=True)
    omega_gamma: float = param(1.0, "HERMES: omega's decrease to the deep boundary, omega = omega0 - gamma * depth (ours: 1.0)", unbounded=True)  # script: 0.9
    schedule_end: str = param("last_middle", "HERMES: where the middle layers' depth reaches 1, last_middle (ours) or first_deep (HERMES' script)", choices=HERMES_SCHEDULE_ENDS)
    # lambda of cross-layer smoothing s_l <- (1-lambda) s_l + lambda s_{l+1}, per layer role, from HERMES' public script
    smoothing_shallow: float = param(0.1, "HERMES: cross-layer smoothing lambda in shallow layers (HERMES' public script: 0.1)", fraction=True)
    smoothing_middle: float = param(0.3, "HERMES: cross-layer smoothing lambda in middle layers (HERMES' public script: 0.3)", fraction=True)
    smoothing_deep: float = param(0.4, "HERMES: cross-layer smoothing lambda in deep layers (HERMES' public script: 0.4)", fraction=True)
    chunk_frames: int = param(16, "HERMES: frames in a chunk, at most one compression per chunk; hard_cap leaves room for the next chunk, script lets it go above the budget (paper: 16)")
    summary_token: bool = param(True, "HERMES: pruned deep-layer tokens folded into one summary token per layer (paper: on)")
    reindex: str = param("lazy", "HERMES: position re-indexing, lazy (streaming, paper's choice) or eager (offline)", choices=HERMES_REINDEX)
    reindex_at: float = param(0.9, "HERMES lazy re-indexing: when positions pass this share of the model's maximum, in (0, 1] (ours: 0.9)", fraction=True)
    pseudo_query: str = param(HERMES_PSEUDO_QUERY, "HERMES: generic question scoring deep and middle layers while streaming (paper 3.3: pseudo query)")  # probe mode
    pseudo_queries: str = param("probe", "HERMES: probe (pseudo_query read once after the prompt) or live (local/global/mixed queries run through the model over the live cache, HERMES' script)", choices=HERMES_PSEUDO_MODES)
    local_query: str = param(HERMES_LOCAL_QUERY, "HERMES live pseudo-queries: the local query; middle layers use 'local; global'")
    global_query: str = param(HERMES_GLOBAL_QUERY, "HERMES live pseudo-queries: the global query, scoring deep layers")

    def __post_init__(self) -> None:
        p = "memory.hermes"
        check_fraction(p, "shallow_ratio", self.shallow_ratio)
        check_fraction(p, "deep_ratio", self.deep_ratio)
        if self.shallow_ratio + self.deep_ratio > 1.0:
            raise ConfigError(f"{p}: shallow_ratio + deep_ratio must be <= 1")
        if self.recency_rate <= 0 or self.recency_rate_deep <= 0:
            raise ConfigError(f"{p}.recency_rate and recency_rate_deep must be > 0")
        for name, choices in (("schedule_end", HERMES_SCHEDULE_ENDS), ("pseudo_queries", HERMES_PSEUDO_MODES), ("recency", HERMES_RECENCY), ("budget_rule", HERMES_BUDGET_RULES)):
            check_choice(f"{p}.{name}", getattr(self, name), choices)
        if self.chunk_frames < 1:
            raise ConfigError(f"{p}.chunk_frames must be >= 1")
        for role in ("shallow", "middle", "deep"):
            check_fraction(p, f"smoothing_{role}", getattr(self, f"smoothing_{role}"))
        check_fraction(p, "reindex_at", self.reindex_at, low_open=True)
        if self.reindex not in HERMES_REINDEX:
            raise ConfigError(f"{p}.reindex must be lazy or eager, got {self.reindex!r}")
        for name in ("pseudo_query", "local_query", "global_query"):
            if not getattr(self, name).strip():
                raise ConfigError(f"{p}.{name} must not be empty")


@policy_config("mukv")
@dataclass(slots=True)
class MuKVConfig:
    """MuKV (seed 001); defaults from the paper's main setting (LLaVA-OV: 49 / 196 / 784 tokens)."""

    granularities: tuple[str, ...] = param(GRANULARITIES, "MuKV: memories built, a non-empty subset of patch, frame, segment (paper: all three)", choices=GRANULARITIES)
    patch_split: int = param(4, "MuKV: a patch block is 1/patch_split of a frame's tokens (paper: 196 / 4 = 49)")
    segment_frames: int = param(4, "MuKV: frames per segment block (paper: 4 x 196 = 784 tokens)")
    alpha_patch: float = param(0.5, "MuKV alpha: weight of attention vs FFT energy when compressing patch blocks (paper: 0.5)", fraction=True)
    alpha_frame: float = param(0.7, "MuKV alpha: weight of attention vs FFT energy when compressing frame blocks (paper: 0.7)", fraction=True)
    alpha_segment: float = param(0.8, "MuKV alpha: weight of attention vs FFT energy when compressing segment blocks (paper: 0.8)", fraction=True)
    keep_patch: float = param(0.1, "MuKV rho: share of a patch block's tokens kept, in (0, 1] (paper: 0.1)", fraction=True)
    keep_frame: float = param(0.1, "MuKV rho: share of a frame block's tokens kept, in (0, 1] (paper: 0.1)", fraction=True)
    keep_segment: float = param(0.8, "MuKV rho: share of a segment block's tokens kept, in (0, 1] (paper: 0.8)", fraction=True)
    retrieve_patch: int = param(20, "MuKV k: patch blocks retrieved for a question; 0 = none (paper: 20 of 64)", zero_ok=True)
    retrieve_frame: int = param(32, "MuKV k: frame blocks retrieved for a question; 0 = none (paper: 32 of 64)", zero_ok=True)
    retrieve_segment: int = param(12, "MuKV k: segment blocks retrieved for a question; 0 = none (paper: 12 of 64)", zero_ok=True)
    rerank_patch: float = param(0.3, "MuKV lambda: weight of consistency with the top segments when reranking patches (paper: 0.3)", fraction=True)
    rerank_frame: float = param(0.3, "MuKV lambda: weight of consistency with the top segments when reranking frames (paper: 0.3)", fraction=True)
    rerank_segment: float = param(0.0, "MuKV lambda: weight of consistency with the top segments when reranking segments (paper: 0)", fraction=True)
    top_segments: int = param(5, "MuKV: segment candidates whose mean is the rerank centroid (paper: 5)")
    over_retrieval: int = param(2, "MuKV: stage 1 keeps over_retrieval x k candidates per granularity (paper: 2)")

    def __post_init__(self) -> None:
        p = "memory.mukv"
        self.granularities = tuple(g for g in self.granularities if g)
        if not self.granularities or any(g not in GRANULARITIES for g in self.granularities):
            raise ConfigError(f"{p}.granularities must be a non-empty subset of {GRANULARITIES}, got {self.granularities}")
        if self.patch_split < 1 or self.segment_frames < 1 or self.top_segments < 1 or self.over_retrieval < 1:
            raise ConfigError(f"{p}: patch_split, segment_frames, top_segments and over_retrieval must be >= 1")
        for g in GRANULARITIES:
            check_fraction(p, f"alpha_{g}", getattr(self, f"alpha_{g}"))
            check_fraction(p, f"keep_{g}", getattr(self, f"keep_{g}"), low_open=True)
            check_fraction(p, f"rerank_{g}", getattr(self, f"rerank_{g}"))
            if getattr(self, f"retrieve_{g}") < 0:
                raise ConfigError(f"{p}.retrieve_{g} must be >= 0")


POLICIES = tuple(POLICY_CONFIGS)  # the names memory.policy takes, in declaration order


@dataclass(slots=True)
class TGVKVConfig:
    """TGV-KV (seed 004), the question-time stage."""

    keep_ratio: float = param(0.05, "TGV-KV: share of the assembled context's KV kept for decoding, in (0, 1] (paper: 0.05)", fraction=True)

    def __post_init__(self) -> None:
        check_fraction("memory.tgvkv", "keep_ratio", self.keep_ratio, low_open=True)


@dataclass(slots=True)
class MemoryConfig:
    """The memory engine's configuration. Defaults are the ``robot`` preset; ``presets.preset_memory_config``
    builds the ``paper`` one (a value given explicitly wins over the preset's)."""

    policy: str = param("rekv", f"memory policy, chosen at start: {', '.join(POLICIES)}", choices=POLICIES)  # never changed at run time
    preset: str = param("robot", f"defaults of the memory's parameters: {' or '.join(PRESETS)} (robot: memory-conscious; paper: each seed's own values and mechanisms); a parameter set explicitly wins", choices=PRESETS)  # recorded, never read by policies
    question_stage: str = param("none", f"question-time stage after the question's prefill: {' or '.join(QUESTION_STAGES)}", choices=QUESTION_STAGES)
    budget_tokens: int = param(16384, "cap on KV resident on the model's device, prompt sink included, in tokens' worth over all layers (hermes: per layer)", runtime=True)
    offload_bytes: int = param(1 << 30, "cap on host RAM for offloaded KV blocks, allocated once (rekv)", zero_ok=True)
    local_window_tokens: int = param(DEFAULT_WINDOW_TOKENS, f"tokens of recent frames each new frame attends to while encoding, and a question reads besides the retrieved ones (default: {DEFAULT_WINDOW_FRAMES} frames of videokv-tiny's 12 tokens; left at the default, a model with larger frames gets {DEFAULT_WINDOW_FRAMES} of its own frames: records/model_fit.py)")
    retrieve_frames: int = param(16, "rekv: frame blocks retrieved per layer for a question, besides the recent window", runtime=True, zero_ok=True)
    prefill_batch: int = param(4, "frames prefilled in one decoder pass when the policy allows it (rekv), each exactly as alone; questions waiting run between two such passes; 1: a pass per frame")
    page_tokens: int = param(4, "allocation unit of the host arena, in tokens")  # divides 196 (LLaVA-OV) and 16 (tiny) exactly
    max_question_tokens: int = param(512, "longer questions are refused", runtime=True)
    snapshot_dir: str = param("", "directory of memory snapshots (~/save_memory, ~/load_memory); empty: snapshots disabled")
    snapshot_on_shutdown: str = param("", "snapshot name written when the node shuts down cleanly; empty: none")
    restore_on_start: str = param("", "snapshot name loaded at start if present (a bad one is logged, memory starts empty); 'latest': the newest periodic snapshot that passes every check, falling back to older ones; empty: none")
    snapshot_period_s: float = param(0.0, "seconds (node clock) between periodic snapshots into memory.snapshot_dir, each writing only what is new; 0: off")
    snapshot_keep: int = param(3, "periodic snapshots kept, the newest; older ones are deleted after each good write")
    # One section per policy of POLICY_CONFIGS with a config (checked below), then the question stage's.
    rekv: ReKVConfig = field(default_factory=ReKVConfig)
    streamkv: StreamKVConfig = field(default_factory=StreamKVConfig)
    hermes: HermesConfig = field(default_factory=HermesConfig)
    mukv: MuKVConfig = field(default_factory=MuKVConfig)
    tgvkv: TGVKVConfig = field(default_factory=TGVKVConfig)
    redundancy: RedundancyConfig = field(default_factory=RedundancyConfig)  # still frames (issue 36), any policy

    def __post_init__(self) -> None:
        check_choice("memory.policy", self.policy, tuple(POLICY_CONFIGS))  # POLICIES, and any declared since
        check_choice("memory.preset", self.preset, PRESETS)
        check_choice("memory.question_stage", self.question_stage, QUESTION_STAGES)
        for name in ("budget_tokens", "local_window_tokens", "page_tokens", "max_question_tokens", "prefill_batch"):
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
            raise ConfigError(f"memory.local_window_tokens ({self.local_window_tokens}) must be smaller than "
                              f"memory.budget_tokens ({self.budget_tokens}): the window is part of the resident budget")


def _check_policy_sections() -> None:
    """Every declared policy with a config has its section on MemoryConfig, under its own name."""
    sections = {f.name: f.default_factory for f in dataclasses.fields(MemoryConfig) if f.default_factory is not dataclasses.MISSING}
    missing = [name for name, cls in POLICY_CONFIGS.items() if cls is not None and sections.get(name) is not cls]
    if missing:
        raise TypeError(f"MemoryConfig has no section of the declared policies {missing} (a field <name>: <its config>)")


_check_policy_sections()


@dataclass(frozen=True, slots=True)
class AnswerConfig:
    """How an answer is read from the model (ROS parameters ``answer.*``)."""

    # How a multiple-choice question picks its option (VideoMemoryEngine.ask): likelihood scores each option's text on
    # one cached question context; letter is what instruction-following Video-LLMs are evaluated with (videokv-tiny v2 read it at chance).
    option_scoring: str = param(DEFAULT_OPTION_SCORING, f"multiple choice: {' or '.join(OPTION_SCORINGS)} (likelihood: each option's text scored as the answer, mean log-probability per token over the tokens that tell the options apart, softmax; letter: the option letters' logits; labels such as 'A) ' on every option dropped)", runtime=True, choices=OPTION_SCORINGS)

    # ~/locate's second ranking (memory/questions/locate.py, "Likelihood re-ranking"): the model reads each of the
    # first ranking's best frames alone; 0 keeps the first ranking (one probe or prefill, no more).
    locate_rerank: int = param(8, "~/locate: the first ranking's best max(N, top_k) frames re-ranked by the likelihood of the query as the model's answer to answer.locate_prompt about each frame alone (short decoder passes, frames of one size 8 to a pass); 0: off", runtime=True, zero_ok=True)
    locate_prompt: str = param("What is in the image?", "~/locate re-ranking: the open question each shortlisted frame is asked, the query's subject scored as its answer", runtime=True)
    locate_words: bool = param(True, "~/locate re-ranking: also read the frames whose words (a model's own, videokv-tiny v5's nouns) name the query's thing (memory/store/words.py)", runtime=True)

    def __post_init__(self) -> None:
        check_choice("answer.option_scoring", self.option_scoring, OPTION_SCORINGS)
        if self.locate_rerank < 0:
            raise ConfigError(f"answer.locate_rerank must be >= 0 (0: off), got {self.locate_rerank}")
        if not self.locate_prompt.strip():
            raise ConfigError("answer.locate_prompt must not be empty")


@dataclass(slots=True)
class GenerationConfig:
    """How answers are generated (ROS parameters ``max_new_tokens*`` and ``answer.*``)."""

    max_new_tokens: int = param(64, "default answer length in tokens when a request gives 0", runtime=True)
    max_new_tokens_limit: int = param(1024, "requests asking for more tokens are refused", runtime=True)
    answer: AnswerConfig = field(default_factory=AnswerConfig)  # ROS parameters answer.*

    def __post_init__(self) -> None:
        if not 0 < self.max_new_tokens <= self.max_new_tokens_limit:
            raise ConfigError(
                f"max_new_tokens must be in [1, {self.max_new_tokens_limit}], got {self.max_new_tokens}"
            )
