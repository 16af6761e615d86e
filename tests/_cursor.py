"""A stream whose state is its cursor: an iterable dataset that is its own
iterator, as a plain class, so that a test can give it fastload's base
(``class Stream(Cursor, fl.IterableDataset)``) or torch's."""


class Cursor:
    """Nine samples, 1 to 9; its state is how many it gave."""

    def __init__(self):
        self.i = 0

    def __iter__(self):
        self.i = 0
        return self

    def __next__(self):
        if self.i >= 9:
            raise StopIteration
        self.i += 1
        return self.i

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, state):
        self.i = state["i"]
