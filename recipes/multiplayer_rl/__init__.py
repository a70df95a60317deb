"""Multi-turn and multi-player RL recipes: twenty questions, guess the number, tic-tac-toe self-play (text arena)."""
