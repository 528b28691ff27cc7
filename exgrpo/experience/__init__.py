"""Experience management of ExGRPO (docs/algorithm.md §2-5): pool, bucket sampler, trajectory selection, persistence.

Framework-free: plain objects and functions that the verl adapter (``recipe/exgrpo``) wires in. The pool is made
of components (entry table, token storage, bucket index, collection rules); docs/experience.md has the table.
"""

from exgrpo.experience.arena import ArenaStorage
from exgrpo.experience.buckets import BucketIndex
from exgrpo.experience.collection import CollectionRules
from exgrpo.experience.entries import EntryTable
from exgrpo.experience.experience_pool import ExperiencePool
from exgrpo.experience.persistence import (
    SCHEMA_VERSION,
    PoolCheckpointError,
    experience_exists,
    load_experience,
    save_experience,
)
from exgrpo.experience.records import Candidate, CollectStats, Group, GroupMember, QuestionId, is_success
from exgrpo.experience.sampler import (
    BUCKET_WEIGHTINGS,
    BucketSampler,
    ReplayDraw,
    bucket_probabilities,
    get_bucket_weighting,
    register_bucket_weighting,
)
from exgrpo.experience.selection import (
    TRAJECTORY_METRICS,
    CandidateTokenStats,
    MetricContext,
    ScoreProvider,
    SelectedTrajectory,
    TrajectorySelector,
    get_trajectory_metric,
    masked_mean_per_row,
    ngram_overlap_scores,
    register_trajectory_metric,
    selection_metrics,
    trajectory_scores,
)
from exgrpo.experience.storage import PerEntryStorage, TokenStorage

__all__ = [
    "BUCKET_WEIGHTINGS",
    "SCHEMA_VERSION",
    "TRAJECTORY_METRICS",
    "ArenaStorage",
    "BucketIndex",
    "BucketSampler",
    "Candidate",
    "CandidateTokenStats",
    "CollectStats",
    "CollectionRules",
    "EntryTable",
    "ExperiencePool",
    "Group",
    "GroupMember",
    "MetricContext",
    "PerEntryStorage",
    "PoolCheckpointError",
    "QuestionId",
    "ReplayDraw",
    "ScoreProvider",
    "SelectedTrajectory",
    "TokenStorage",
    "TrajectorySelector",
    "bucket_probabilities",
    "experience_exists",
    "get_bucket_weighting",
    "get_trajectory_metric",
    "is_success",
    "load_experience",
    "masked_mean_per_row",
    "ngram_overlap_scores",
    "register_bucket_weighting",
    "register_trajectory_metric",
    "save_experience",
    "selection_metrics",
    "trajectory_scores",
]
