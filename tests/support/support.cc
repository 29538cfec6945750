// Shared test helpers; see multi_rank.h.
