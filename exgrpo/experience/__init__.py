"""Experience management of ExGRPO (docs/algorithm.md §2-5): pool, bucket sampler, trajectory selection, persistence.

Framework-free: plain objects and functions that the verl adapter (``recipe/exgrpo``) wires in.
"""

from exgrpo.experience.persistence import (
    SCHEMA_VERSION,
    PoolCheckpointError,
    experience_exists,
    load_experience,
    save_experience,
)
from exgrpo.experience.pool import (
    BucketIndex,
    Candidate,
    CollectStats,
    ExperiencePool,
    Group,
    GroupMember,
    QuestionId,
    is_success,
)
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

__all__ = [
    "BUCKET_WEIGHTINGS",
    "SCHEMA_VERSION",
    "TRAJECTORY_METRICS",
    "BucketIndex",
    "BucketSampler",
    "Candidate",
    "CandidateTokenStats",
    "CollectStats",
    "ExperiencePool",
    "Group",
    "GroupMember",
    "MetricContext",
    "PoolCheckpointError",
    "QuestionId",
    "ReplayDraw",
    "ScoreProvider",
    "SelectedTrajectory",
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
