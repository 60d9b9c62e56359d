"""Records of results (one method on one population) and the leaderboard's data."""
