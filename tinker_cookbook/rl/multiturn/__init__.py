"""Multi-turn and multi-agent RL environments.

- ``message_env``: ``MessageEnv`` (a game written in messages) and ``EnvFromMessageEnv`` (the token ``Env`` the RL
  loop rolls out; its observations extend turn by turn, so an episode trains as one datum);
- ``twenty_questions``: the player asks an answerer model (another sampling client) yes/no questions to find a
  secret word; recipe ``recipes/multiplayer_rl/twenty_questions/train.py``;
- ``guess_number``: find a hidden integer from "Too low" / "Too high" feedback; recipe ``recipes/multiplayer_rl/guess_number/train.py``;
- ``text_arena``: tic-tac-toe for two seats, both the policy (self-play) or one a fixed opponent; recipe
  ``recipes/multiplayer_rl/text_arena/train.py``.
"""
