"""The AlphaZero loop: games, batched MCTS, the policy-value network, self-play, arena."""
