"""The names of the per-row fields the replay step adds to a step's rows, which the actor loss reads in the workers
(recipe/exgrpo/actor_loss.py) and every adapter carries to the update with the other fields of a row."""

from __future__ import annotations

#: per row of a step: the question's stable id and its row in the training data (recipe/exgrpo/dataset.py adds them)
QUESTION_ID_KEY = "exgrpo_question_id"
ROW_KEY = "exgrpo_row"
IS_REPLAY_KEY = "exgrpo_is_replay"
#: per row: -1 for a generated row, j for the j-th candidate trajectory (flattened over the replayed questions)
CANDIDATE_KEY = "exgrpo_candidate"
BEHAVIOUR_LOG_PROBS_KEY = "exgrpo_behaviour_log_probs"
# per-row copies of step-wide values, so that every micro-batch of the actor update carries them
MIXED_KEY = "exgrpo_mixed"
RATIO_KEY = "exgrpo_replay_ratio"
# the row's group (uid) holds a replayed member: the experience term of paper Eq. 4 (weight_terms_by_ratio)
EXPERIENCE_GROUP_KEY = "exgrpo_experience_group"
#: verl's agent loop: turns of the exchange (user + assistant + tool), per row
NUM_TURNS_KEY = "__num_turns__"
#: verl's tool agent loop's per-trajectory records of its run (per turn scores, per tool call rewards): a replayed
#: row has the keys (every row does) but no record of its own, since replay never runs the loop again: None, as verl
#: fills a key a row's loop did not report
TRAJECTORY_RECORD_KEYS = ("turn_scores", "tool_rewards")
#: the old-log-prob pass's per-token entropies (verl's name for them)
ENTROPY_KEY = "entropys"
