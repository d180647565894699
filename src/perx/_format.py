"""The file format of ``ReplayBuffer.save`` and ``ReplayBuffer.load``: an uncompressed ``.npz`` of numeric ``.npy``
members and one JSON metadata member.

Members: ``meta`` (uint8 [n], UTF-8 JSON: format, version, capacity, next_id, the field spec, the sampler's name,
configuration and state metadata, with episodes their metadata, with dict fields their keys), ``data/<field>``
(the first ``size`` rows of each stored field), ``sampler/<name>`` (the sampler's primary arrays: raw priorities,
heap arrays; never trees), ``episodes/<name>`` (the episode links). docs/design.md, "Save and load", gives the
rules; this module keeps them:

- ``save`` writes to a temporary file in the same folder, fsyncs it and renames it over the path
  (:mod:`perx._atomic`);
- ``load`` treats the file as untrusted: it never unpickles (only uncompressed numeric members are read, through
  their ``.npy`` headers, and their CRC-32 is checked), rebuilds the buffer through its constructor (so every check
  of ``spec=`` runs) and the sampler from the registry by name, checks every value, and raises ``ValueError``
  naming the path for anything wrong. Field data is read in chunks straight into the new buffer's arrays.

Versions: 1 (perx 0.1: tree nodes saved, dropped on load), 2 (primary sampler state only; what a buffer without
dict fields is still saved as, so that earlier perx reads it), 3 (adds ``dict_fields``).
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from perx import _atomic
from perx._mmap import STATE, MappedFileError, MappedFolder, register
from perx._nested import DictLayout, flat_name
from perx.episodes import Episodes, EpisodeStore
from perx.samplers.base import Sampler
from perx.storage import FieldSpec, Storage

if TYPE_CHECKING:  # (perx.buffer imports this module)
    from perx.buffer import ReplayBuffer

FORMAT = "perx.ReplayBuffer"
#: Version 2 (perx 0.2) saves only primary sampler state (no tree nodes) and RankBased's segment cache.
#: Version 3 adds ``dict_fields`` (dict fields: their keys, shapes and dtypes); a buffer without dict fields is
#: still saved as version 2, so that earlier perx reads it, and earlier perx refuses files it would misread.
FORMAT_VERSION = 3


def save(buf: ReplayBuffer, path: str | os.PathLike, *, mapped: bool = False) -> None:
    """Write ``buf`` (data, sampler state with its generator, episode state, counter) to ``path`` atomically
    (``ReplayBuffer.save``). The sampler's and the episode store's arrays are written as they are, not copied.
    With ``mapped`` (a memmap buffer's ``state.npz``), the arrays that live in the buffer's files (the stored
    fields, the observation ring) are left out and ``meta["mapped"]`` says so."""
    path = Path(path)
    size = len(buf)
    sampler_meta, sampler_arrays = buf.sampler.state_dict()
    spec = buf._storage.spec
    meta = {
        "format": FORMAT,
        "version": FORMAT_VERSION if buf._dicts else 2,
        "capacity": buf.capacity,
        "next_id": buf._storage.next_id,
        "spec": None if spec is None else {k: f.to_json() for k, f in spec.items()},
        "inferred": buf._storage.inferred,
        "sampler": {"name": buf.sampler.name, "config": buf.sampler.config(), "state": sampler_meta},
    }
    if buf._dicts:  # their keys, and each key's shape and dtype (the stored names and packed units follow)
        nested = cast(dict[str, dict[str, FieldSpec]], buf.spec)  # (read at the dict fields only)
        meta["dict_fields"] = {name: [[k, list(f.shape), f.dtype.str] for k, f in nested[name].items()]
                               for name in buf._dicts}
    arrays = {}
    if mapped:
        meta["mapped"] = True
    for name, arr in buf._storage.data.items() if not mapped else ():
        arrays[f"data/{name}"] = arr[:size]
    for key, arr in sampler_arrays.items():
        arrays[f"sampler/{key}"] = arr
    if buf._episodes is not None:
        episode_meta, episode_arrays = buf._episodes.state_dict(size, buf._storage.next_id, with_units=not mapped)
        meta["episodes"] = episode_meta
        for key, arr in episode_arrays.items():
            arrays[f"episodes/{key}"] = arr
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    # (numpy's stub types savez's keywords as its allow_pickle; no member is named so)
    _atomic.write(path, lambda f: np.savez(f, **arrays))  # type: ignore[arg-type]


def load(cls: type[ReplayBuffer], path: str | os.PathLike, lock: bool) -> ReplayBuffer:
    """The buffer saved at ``path``, built as ``cls`` (``ReplayBuffer.load``). ValueError naming the path for
    anything wrong with the file; the errors of opening it pass through."""
    path = Path(path)
    with open(path, "rb") as f:
        try:
            return _read(cls, f, lock)
        except _LoadError as err:
            raise ValueError(f"path: cannot load a replay buffer from {str(path)!r}: {err}") from None
        except Exception as err:
            raise ValueError(f"path: cannot load a replay buffer from {str(path)!r}: the file is "
                             f"truncated or corrupted, or was crafted ({type(err).__name__}: {err})") from err


def open_mapped(cls: type[ReplayBuffer], path: str | os.PathLike, lock: bool) -> ReplayBuffer:
    """The memmap buffer closed in the folder ``path`` (``ReplayBuffer.open``): its ``state.npz`` is read as
    :func:`load` reads a file, and the buffer is built over the folder's files. ValueError naming the path for
    anything wrong; the folder is left as it was (closed) if it is refused."""
    folder = MappedFolder(path, reopen=True)  # refuses a folder not closed
    state = folder.path / STATE
    try:
        with open(state, "rb") as f:
            try:
                buf = _read(cls, f, lock, folder)
            except _LoadError as err:
                raise ValueError(f"path: cannot open the memmap buffer {str(folder.path)!r}: {err}") from None
            except MappedFileError:
                raise
            except Exception as err:
                raise ValueError(f"path: cannot open the memmap buffer {str(folder.path)!r}: {STATE} is truncated "
                                 f"or corrupted ({type(err).__name__}: {err})") from err
    except BaseException:
        folder.discard()  # (removes only its open marker: the folder stays closed)
        raise
    folder.reopen = False  # fields fixed from now on are new files
    register(buf)  # (only now: a refused open must never write its state at exit)
    return buf


class _LoadError(Exception):
    """A file that parsed but whose content is refused (the message says why)."""


def _read(cls: type[ReplayBuffer], f, lock: bool, folder: MappedFolder | None = None) -> ReplayBuffer:
    with zipfile.ZipFile(f) as zf:
        infos = zf.infolist()
        names = [info.filename for info in infos]
        if len(set(names)) != len(names):
            raise _LoadError("the archive has duplicate members")
        members = {}
        for info in infos:
            if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1 or not info.filename.endswith(".npy"):
                raise _LoadError(f"member {info.filename!r} is not an uncompressed .npy array; perx writes "
                                 f"nothing else")
            members[info.filename[: -len(".npy")]] = info
        if "meta" not in members:
            raise _LoadError("not a saved perx.ReplayBuffer (no metadata)")
        meta = json.loads(_read_member(zf, members.pop("meta")).tobytes().decode())
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise _LoadError("not a saved perx.ReplayBuffer")
        if meta.get("version") == 1:
            _upgrade_v1(meta, members)
        elif meta.get("version") not in (2, FORMAT_VERSION):
            raise _LoadError(f"format version {meta.get('version')!r}; this perx reads versions 1 to "
                             f"{FORMAT_VERSION}")
        capacity, next_id, spec, sampler, episodes = _parse_meta(meta)
        if bool(meta.get("mapped", False)) != (folder is not None):
            raise _LoadError("a memmap buffer's state (open its folder with ReplayBuffer.open)" if folder is None
                             else "not a memmap buffer's state")
        dicts = _parse_dicts(meta)
        build_spec, shared_keys = _spec_with_dicts(spec, dicts, episodes)
        expected_data = set() if spec is None or folder is not None else {f"data/{name}" for name in spec}
        found_data = {k for k in members if k.startswith("data/")}
        if found_data != expected_data:
            raise _LoadError(f"data members {sorted(found_data)} do not match the fields {sorted(expected_data)}")
        unknown = sorted(k for k in members if not k.startswith(("data/", "sampler/", "episodes/")))
        if unknown:
            raise _LoadError(f"unexpected members {unknown}")
        try:
            buf = cls(capacity, sampler, spec=build_spec, lock=lock, episodes=episodes, memmap=folder)
        except MemoryError as err:
            raise _LoadError(f"capacity {capacity} cannot be allocated here ({err})") from None
        if shared_keys is not None:  # a shared dict observation: packed in the episode store, allocated below
            keys = tuple(shared_keys)
            cfg = cast(Episodes, episodes)  # (shared keys come only with episodes)
            buf._set_dicts({cfg.obs: keys, cfg.next_name: keys}, DictLayout(cfg.obs, shared_keys, cfg.frame_stack))
        if buf._storage.spec != spec:
            raise _LoadError("dict_fields: the keys, shapes and dtypes of the dict fields do not match the stored "
                             "fields")
        storage = buf._storage
        size = min(next_id, capacity)
        for name, arr in storage.data.items() if folder is None else ():
            _read_member(zf, members[f"data/{name}"], into=arr[:size], what=f"data/{name}")
        storage.next_id = next_id
        if spec is not None:
            storage.inferred = bool(meta.get("inferred", False))
        sampler_arrays = {k[len("sampler/"):]: _read_member(zf, info, what=k)
                          for k, info in members.items() if k.startswith("sampler/")}
        episode_arrays = {k[len("episodes/"):]: _read_member(zf, info, what=k)
                          for k, info in members.items() if k.startswith("episodes/")}
    try:  # the sampler is new, thrown away with the buffer if the file is refused
        sampler._load_unguarded(meta["sampler"]["state"], sampler_arrays, size=size, next_id=next_id)
    except (KeyError, TypeError) as err:
        raise _LoadError(f"sampler state: {type(err).__name__}: {err}") from None
    except ValueError as err:
        raise _LoadError(f"sampler state: {err}") from None
    if episodes is None:
        if episode_arrays:
            raise _LoadError("episode arrays in a file without episodes")
        buf._open = buf._layout_open()
        buf._install()
        return buf
    store = cast(EpisodeStore, buf._episodes)  # (built with the episodes)
    try:
        store.load_state_dict(meta["episodes"], episode_arrays, size, next_id, buf._storage.data,
                              with_units=folder is None)
    except (KeyError, TypeError, IndexError) as err:
        raise _LoadError(f"episode state: {type(err).__name__}: {err}") from None
    except ValueError as err:
        raise _LoadError(f"episode state: {err}") from None
    if episodes.shared and store.obs_spec is not None:
        shape, dtype = store.obs_spec
        obs_check = cast(Storage, buf._obs_check)  # (shared mode)
        obs_check._allocate({episodes.obs: FieldSpec(shape, dtype), episodes.next_name: FieldSpec(shape, dtype)})
        obs_check.inferred = bool(meta.get("inferred", False))
    if buf._key_check is not None:
        buf._key_check.inferred = bool(meta.get("inferred", False))
    buf._open = buf._layout_open()
    buf._install()
    return buf


def _upgrade_v1(meta: dict, members: dict) -> None:
    """Files of perx 0.1: their tree nodes are derived state (rebuilt now, so dropped unread), and
    they had no segment cache (the cache starts empty, as it did after a load then)."""
    members.pop("sampler/nodes", None)
    members.pop("sampler/max_nodes", None)
    info = meta.get("sampler")
    if isinstance(info, dict) and info.get("name") == "RankBased" and isinstance(info.get("state"), dict):
        info["state"].setdefault("segments", [])


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, into: np.ndarray | None = None,
                 what: str = "meta") -> np.ndarray:
    """One .npy member, never unpickled; with ``into`` its data is read straight into that (C-contiguous)
    array, whose shape and dtype it must have. The member's CRC is checked (zipfile raises at its end)."""
    with zf.open(info) as fp:
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp)
        else:
            raise _LoadError(f"{what}: unsupported .npy version {version}")
        if dtype.hasobject or dtype.kind not in "biufc" or fortran:
            raise _LoadError(f"{what}: holds {dtype} data{' in Fortran order' if fortran else ''}; perx stores "
                             f"only C-ordered numbers (and never unpickles)")
        if into is not None:
            if shape != into.shape or dtype != into.dtype:
                raise _LoadError(f"{what}: saved {dtype}{shape} does not match the field's {into.dtype}{into.shape}")
            out = into
        else:
            count = int(np.prod(shape, dtype=np.int64))
            if count * dtype.itemsize > info.file_size:
                raise _LoadError(f"{what}: declares {dtype}{shape}, more than the member holds")
            out = np.empty(shape, dtype)
        if out.flags.c_contiguous:
            _read_exact(fp, out, what)
        else:  # a field's view into the storage's rows: a chunk of rows at a time through a contiguous buffer
            step = max(1, _CHUNK // max(out[0].nbytes, 1))
            for start in range(0, len(out), step):
                part = out[start : start + step]
                tmp = np.empty(part.shape, part.dtype)
                _read_exact(fp, tmp, what)
                part[...] = tmp
        if fp.read(1):  # reading to the end also makes zipfile check the CRC
            raise _LoadError(f"{what}: the member is truncated or has trailing bytes")
    return out


_CHUNK = 1 << 24


def _read_exact(fp, arr: np.ndarray, what: str) -> None:
    """Fill the C-contiguous ``arr`` from ``fp`` in chunks of at most _CHUNK bytes (so a large field never has
    a second copy in memory); _LoadError if the member ends first."""
    # (an ndarray has the buffer protocol: numpy's stub declares it from Python 3.12 on)
    view = memoryview(arr.reshape(-1).view(np.uint8)) if arr.size else memoryview(bytearray())  # type: ignore[arg-type]
    got = 0
    while got < len(view):
        n = fp.readinto(view[got : got + _CHUNK])
        if not n:
            raise _LoadError(f"{what}: the member is truncated or has trailing bytes")
        got += n


def _parse_meta(meta: dict) -> tuple[int, int, dict | None, Sampler, Episodes | None]:
    from perx.samplers.base import check_int

    capacity = check_int(meta.get("capacity"), "capacity", 1, 2**62)
    next_id = check_int(meta.get("next_id"), "next_id", 0, 2**62)
    raw_spec = meta.get("spec")
    if raw_spec is None:
        spec = None
        if next_id != 0:
            raise _LoadError(f"next_id {next_id} with no fields")
    else:
        if not isinstance(raw_spec, dict) or not raw_spec:
            raise _LoadError(f"spec: expected a dict of fields, got {str(raw_spec)[:80]}")
        spec = {}
        for name, item in raw_spec.items():
            try:
                spec[name] = FieldSpec.from_json(item)
            except (TypeError, ValueError, IndexError) as err:
                raise _LoadError(f"spec[{name!r}]: {str(item)[:80]} ({err})") from None
            if any(d < 0 for d in spec[name].shape) or spec[name].dtype.kind not in "biufc":
                raise _LoadError(f"spec[{name!r}]: invalid shape or dtype {str(item)[:80]}")
    info = meta.get("sampler")
    if not isinstance(info, dict) or not isinstance(info.get("config"), dict) or not isinstance(info.get("name"), str):
        raise _LoadError("sampler: expected {name, config, state}")
    sampler_cls = Sampler.registry.get(info["name"])
    if sampler_cls is None:
        raise _LoadError(f"sampler: unknown sampler {info['name']!r}; known: {sorted(Sampler.registry)}")
    try:
        sampler = sampler_cls(**info["config"])
    except (TypeError, ValueError) as err:
        raise _LoadError(f"sampler config {str(info['config'])[:120]}: {err}") from None
    episodes = None
    if meta.get("episodes") is not None:
        ep = meta["episodes"]
        if not isinstance(ep, dict) or not isinstance(ep.get("config"), dict):
            raise _LoadError("episodes: expected {config, obs_spec}")
        try:
            episodes = Episodes(**ep["config"])
        except (TypeError, ValueError) as err:
            raise _LoadError(f"episodes config {str(ep['config'])[:120]}: {err}") from None
    return capacity, next_id, spec, sampler, episodes


def _parse_dicts(meta: dict) -> dict[str, dict[str, FieldSpec]]:
    """The dict fields of a file of format version 3 (name -> key -> FieldSpec), checked as far as they go."""
    raw = meta.get("dict_fields")
    if meta.get("version") != 3:
        if raw is not None:
            raise _LoadError("dict_fields in a file of format version 1 or 2")
        return {}
    if not isinstance(raw, dict) or not raw:
        raise _LoadError(f"dict_fields: expected a dict of dict fields in a file of format version 3, got "
                         f"{str(raw)[:80]}")
    out = {}
    for name, items in raw.items():
        if not isinstance(items, list) or not items:
            raise _LoadError(f"dict_fields[{name!r}]: expected a list of [key, shape, dtype], got {str(items)[:80]}")
        keys = {}
        for item in items:
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) and item[0]
                    and item[0] not in keys):
                raise _LoadError(f"dict_fields[{name!r}]: {str(item)[:80]} is not [key, shape, dtype] of a new key")
            try:
                f = FieldSpec.from_json(item[1:])
            except (TypeError, ValueError, IndexError) as err:
                raise _LoadError(f"dict_fields[{name!r}][{item[0]!r}]: {str(item)[:80]} ({err})") from None
            if any(d < 0 for d in f.shape) or f.dtype.kind not in "biufc":
                raise _LoadError(f"dict_fields[{name!r}][{item[0]!r}]: invalid shape or dtype {str(item)[:80]}")
            keys[item[0]] = f
        out[name] = keys
    return out


def _spec_with_dicts(spec: dict | None, dicts: dict, episodes: Episodes | None) -> tuple[dict | None, dict | None]:
    """(the ``spec=`` that rebuilds a saved buffer with dict fields; the keys of a shared dict observation, which the
    storage does not hold: set up after the buffer is built, and allocated when the episode state is loaded)."""
    if not dicts:
        return spec, None
    obs_names: tuple[str, ...] = (episodes.obs, episodes.next_name) if episodes is not None else ()
    shared = None
    if episodes is not None and episodes.shared and any(n in dicts for n in obs_names):
        if not all(n in dicts for n in obs_names) or dicts[obs_names[0]] != dicts[obs_names[1]]:
            raise _LoadError(f"dict_fields: {obs_names[0]} and {obs_names[1]} must be dicts with the same keys")
        shared = dicts[obs_names[0]]
    owner = {flat_name(n, k): n for n, keys in dicts.items() if n not in obs_names for k in keys}
    out = {}
    for name, f in (spec or {}).items():
        if name in dicts and name in obs_names:  # next_obs="stored": the packed unit, stored under the name
            out[name] = dict(dicts[name])
        elif name in owner:
            out.setdefault(owner[name], dict(dicts[owner[name]]))
        else:
            out[name] = f
    left = [n for n in dicts if n not in out and (shared is None or n not in obs_names)]
    if left:
        raise _LoadError(f"dict_fields: {left} are not among the stored fields")
    return out or None, shared
