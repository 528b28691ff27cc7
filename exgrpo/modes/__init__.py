"""The reward modes (docs/algorithm.md §3, §9, §13): one registered strategy per mode, ``exgrpo.reward_mode``.

``binary`` (the paper's main method: 0/1 rewards, buckets are success counts) and ``continuous`` (real-valued
rewards such as a reward model's: buckets from the normalised within-group reward spread). What a mode owns and how
to add one: ``exgrpo/modes/base.py``. Importing this package registers every mode shipped with the recipe.
"""

from exgrpo.modes.base import (
    DEFAULT_REWARD_MODE,
    REWARD_MODES,
    GroupPlan,
    ModeOptions,
    RewardMode,
    get_reward_mode,
    option_declarations,
    option_owners,
    register_reward_mode,
    saved_mode_name,
)
from exgrpo.modes.binary import BinaryMode, BinaryOptions
from exgrpo.modes.continuous import ContinuousMode, ContinuousOptions

__all__ = [
    "DEFAULT_REWARD_MODE",
    "REWARD_MODES",
    "BinaryMode",
    "BinaryOptions",
    "ContinuousMode",
    "ContinuousOptions",
    "GroupPlan",
    "ModeOptions",
    "RewardMode",
    "get_reward_mode",
    "option_declarations",
    "option_owners",
    "register_reward_mode",
    "saved_mode_name",
]
