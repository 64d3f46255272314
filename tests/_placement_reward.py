"""A dense reward for the separate-pool trainer tests: distinct characters per character of the response,
so that a group's responses score differently and the advantages (hence the losses) are not zero."""


def reward(response: str, answer: str) -> float:
    return len(set(response)) / (1.0 + len(response))
