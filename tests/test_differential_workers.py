"""num_workers > 0, fastload against torch.utils.data: ordering, interleaving,
lengths, drop_last, worker_init_fn and get_worker_info."""
import numpy as np
import pytest

import fastload as fl

torch = pytest.importorskip("torch", reason="differential tests need torch to compare with")
tud = torch.utils.data


class MapRows:
    def __len__(self):
        return 45

    def __getitem__(self, i):
        return np.arange(3, dtype=np.int64) + i, float(i)


def make_stream(base):
    class Stream(base):
        """Uneven shards, so workers run dry at different times."""

        def __iter__(self):
            info = (torch.utils.data.get_worker_info() if base is tud.IterableDataset
                    else fl.get_worker_info())
            wid, n = (0, 1) if info is None else (info.id, info.num_workers)
            for i in range(wid * 100, wid * 100 + 7 + 5 * wid):
                yield np.array([i], dtype=np.int64)
    return Stream()


def as_numpy(batch):
    if isinstance(batch, (list, tuple)):
        return [as_numpy(b) for b in batch]
    return np.asarray(batch)


def same(a, b):
    a, b = as_numpy(a), as_numpy(b)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a.shape == b.shape and np.array_equal(a, b)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_map_style_order_and_length(workers, drop_last):
    ours = fl.DataLoader(MapRows(), batch_size=4, num_workers=workers, drop_last=drop_last)
    theirs = tud.DataLoader(MapRows(), batch_size=4, num_workers=workers, drop_last=drop_last)
    assert len(ours) == len(theirs)
    got, want = list(ours), list(theirs)
    assert len(got) == len(want)
    assert all(same(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("workers", [2, 3])
def test_iterable_interleaving_matches_torch(workers, drop_last):
    ours = fl.DataLoader(make_stream(fl.IterableDataset), batch_size=3, num_workers=workers,
                         drop_last=drop_last)
    theirs = tud.DataLoader(make_stream(tud.IterableDataset), batch_size=3,
                            num_workers=workers, drop_last=drop_last)
    got, want = [as_numpy(b).ravel().tolist() for b in ours], [
        as_numpy(b).ravel().tolist() for b in theirs]
    assert got == want


def test_shuffle_with_a_torch_generator_matches_torch_with_workers():
    ours = fl.DataLoader(MapRows(), batch_size=5, shuffle=True, num_workers=2,
                         generator=torch.Generator().manual_seed(3))
    theirs = tud.DataLoader(MapRows(), batch_size=5, shuffle=True, num_workers=2,
                            generator=torch.Generator().manual_seed(3))
    assert all(same(g, w) for g, w in zip(list(ours), list(theirs)))


class InfoFacts:
    def __init__(self, get_info):
        self.get_info = get_info

    def __len__(self):
        return 6

    def __getitem__(self, i):
        info = self.get_info()
        return np.array([info.id, info.num_workers, int(info.dataset is self)])


def init_records_id(worker_id):
    np.random.seed(1000 + worker_id)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_worker_info_fields_and_init_ids_match_torch(method):
    ours = fl.DataLoader(InfoFacts(fl.get_worker_info), batch_size=1, num_workers=2,
                         worker_init_fn=init_records_id, multiprocessing_context=method)
    theirs = tud.DataLoader(InfoFacts(tud.get_worker_info), batch_size=1, num_workers=2,
                            worker_init_fn=init_records_id, multiprocessing_context=method)
    got = [as_numpy(b).ravel().tolist() for b in ours]
    want = [as_numpy(b).ravel().tolist() for b in theirs]
    assert got == want
    assert {g[0] for g in got} == {0, 1}
