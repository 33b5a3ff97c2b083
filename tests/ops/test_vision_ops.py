"""Relay's vision ops (get_valid_counts, non_max_suppression, all_class_non_max_suppression, roi_align) and
sparse_fill_empty_rows against loop oracles written here and hand-checked cases: the NumPy kernel, type
relation and shape function (check_op), then Relay-text programs on the interpreter, target python and
target c (no NumPy fallback)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from op_testing import check_op
from relay_runner import check_everywhere, run_everywhere

import tensorvm as tv
from tensorvm.errors import ExecutionError, ShapeError, TypeInferenceError
from tensorvm.ir.types import Any, TensorType
from tensorvm.op import get_op

# ---- oracles ------------------------------------------------------------------------------------------


def iou(a, b):
    """IoU of corner boxes, written from the definition (corners normalized per axis)."""
    ax = sorted([a[0], a[2]]), sorted([a[1], a[3]])
    bx = sorted([b[0], b[2]]), sorted([b[1], b[3]])
    overlap = 1.0
    for (lo_a, hi_a), (lo_b, hi_b) in zip(ax, bx, strict=True):
        overlap *= max(0.0, min(hi_a, hi_b) - max(lo_a, lo_b))
    area = lambda box: (box[0][1] - box[0][0]) * (box[1][1] - box[1][0])  # noqa: E731
    union = area(ax) + area(bx) - overlap
    return overlap / union if union > 0 else 0.0


def descending(scores):
    """Positions by descending score, ties by position."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def valid_counts_oracle(data, threshold, id_index=0, score_index=1):
    batch, anchors, elems = data.shape
    counts, out, out_indices = np.zeros(batch, "int32"), np.full_like(data, -1), np.full((batch, anchors), -1, "int32")
    for b in range(batch):
        for j in range(anchors):
            if data[b, j, score_index] > threshold and (id_index < 0 or data[b, j, id_index] >= 0):
                out[b, counts[b]] = data[b, j]
                out_indices[b, counts[b]] = j
                counts[b] += 1
    return counts, out, out_indices


def nms_oracle(data, valid_count, indices, max_output_size, iou_threshold, force_suppress=False, top_k=-1,
               coord_start=2, score_index=1, id_index=0, return_indices=True, invalid_to_bottom=False):
    batch, anchors, _ = data.shape
    box_indices, counts, out = np.full((batch, anchors), -1, "int32"), np.zeros((batch, 1), "int32"), np.full_like(data, -1)
    for b in range(batch):
        n = min(max(int(valid_count[b]), 0), anchors)
        order = descending([float(data[b, j, score_index]) for j in range(n)])
        if top_k > 0:
            order = order[:top_k]
        kept = []
        for slot, j in enumerate(order):
            keep = max_output_size < 0 or len(kept) < max_output_size
            for k in kept:
                same_class = force_suppress or id_index < 0 or data[b, k, id_index] == data[b, j, id_index]
                box_k, box_j = (data[b, r, coord_start:coord_start + 4].tolist() for r in (k, j))
                if same_class and iou(box_k, box_j) >= iou_threshold:
                    keep = False
            if keep:
                kept.append(j)
                out[b, len(kept) - 1 if invalid_to_bottom else slot] = data[b, j]
        for at, j in enumerate(kept):
            box_indices[b, at] = indices[b, j]
        counts[b, 0] = len(kept)
    return (box_indices, counts) if return_indices else out


def all_class_oracle(boxes, scores, max_out, iou_threshold, score_threshold, output_format="onnx"):
    batch, classes, num_boxes = scores.shape
    chosen = []  # (batch, class, box, score)
    for b in range(batch):
        for c in range(classes):
            kept = []
            for i in descending([float(s) for s in scores[b, c]]):
                if scores[b, c, i] <= score_threshold or (max_out >= 0 and len(kept) >= max_out):
                    continue
                if all(iou(boxes[b, k], boxes[b, i]) <= iou_threshold for k in kept):
                    kept.append(i)
            chosen += [(b, c, i, scores[b, c, i]) for i in kept]
    if output_format == "onnx":
        rows = np.zeros((batch * classes * num_boxes, 3), np.int64)
        for at, (b, c, i, _) in enumerate(chosen):
            rows[at] = (b, c, i)
        return rows, np.array([len(chosen)], np.int64)
    rows, out_scores = np.zeros((batch, classes * num_boxes, 2), np.int64), np.zeros((batch, classes * num_boxes),
                                                                                       scores.dtype)
    counts = np.zeros(batch, np.int64)
    for b in range(batch):
        mine = [t for t in chosen if t[0] == b]
        mine = [mine[k] for k in descending([float(t[3]) for t in mine])]
        counts[b] = len(mine)
        for at, (_, c, i, s) in enumerate(mine):
            rows[b, at] = (c, i)
            out_scores[b, at] = s
    return rows, out_scores, counts


def bilinear(feature, y, x):
    """feature[y, x] (a 2-d map), interpolated; 0 outside [-1, size], clamped to the edge inside."""
    h, w = feature.shape
    if y < -1 or y > h or x < -1 or x > w:
        return 0.0
    y, x = min(max(y, 0.0), h - 1), min(max(x, 0.0), w - 1)
    y0, x0 = int(y), int(x)
    y1, x1 = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
    ly, lx = y - y0, x - x0
    return ((1 - ly) * (1 - lx) * feature[y0, x0] + (1 - ly) * lx * feature[y0, x1]
            + ly * (1 - lx) * feature[y1, x0] + ly * lx * feature[y1, x1])


def roi_align_oracle(data, rois, pooled_size, spatial_scale, sample_ratio=-1, layout="NCHW", mode="avg"):
    if layout == "NHWC":
        data = data.transpose(0, 3, 1, 2)
    ph_n, pw_n = pooled_size
    out = np.zeros((len(rois), data.shape[1], ph_n, pw_n))
    for r, (batch, x1, y1, x2, y2) in enumerate(rois.astype(float)):
        x1, y1, x2, y2 = x1 * spatial_scale, y1 * spatial_scale, x2 * spatial_scale, y2 * spatial_scale
        h, w = max(y2 - y1, 1.0), max(x2 - x1, 1.0)
        gy = sample_ratio if sample_ratio > 0 else math.ceil(h / ph_n)
        gx = sample_ratio if sample_ratio > 0 else math.ceil(w / pw_n)
        for c in range(data.shape[1]):
            for ph in range(ph_n):
                for pw in range(pw_n):
                    samples = [bilinear(data[int(batch), c], y1 + ph * h / ph_n + (iy + 0.5) * h / ph_n / gy,
                                        x1 + pw * w / pw_n + (ix + 0.5) * w / pw_n / gx)
                               for iy in range(gy) for ix in range(gx)]
                    out[r, c, ph, pw] = sum(samples) / len(samples) if mode == "avg" else max(samples)
    out = out.astype(data.dtype)
    return out.transpose(0, 2, 3, 1) if layout == "NHWC" else out


def sparse_fill_oracle(indices, values, dense_shape, default):
    rows = {}
    for index, value in zip(indices.tolist(), values.tolist(), strict=True):
        rows.setdefault(index[0], []).append((index, value))
    new_indices, new_values, empty = [], [], []
    for row in range(int(dense_shape[0])):
        empty.append(row not in rows)
        for index, value in rows.get(row, [([row] + [0] * (indices.shape[1] - 1), default)]):
            new_indices.append(index)
            new_values.append(value)
    return (np.array(new_indices, indices.dtype).reshape(-1, indices.shape[1]), np.array(new_values, values.dtype),
            np.array(empty, bool))


# ---- data ----------------------------------------------------------------------------------------------

# (class, score, x1, y1, x2, y2): box 1 overlaps box 0 (IoU 81/119), box 3 is box 0 in class 1, box 4 is
# below any threshold of 0.3, box 5 a background (class -1).
BOXES = np.array([[[0, 0.9, 0, 0, 10, 10], [0, 0.8, 1, 1, 11, 11], [0, 0.7, 20, 20, 30, 30],
                   [1, 0.6, 0, 0, 10, 10], [0, 0.2, 40, 40, 50, 50], [-1, 0.95, 0, 0, 5, 5]]], "float32")


def _detections(seed, batch=2, anchors=12, classes=3):
    rng = np.random.default_rng(seed)
    corners = rng.uniform(0, 20, (batch, anchors, 2))
    sizes = rng.uniform(1, 8, (batch, anchors, 2))
    data = np.concatenate([rng.integers(-1, classes, (batch, anchors, 1)), rng.uniform(0, 1, (batch, anchors, 1)),
                           corners, corners + sizes], axis=2).astype("float32")
    data[:, ::5, 1] = data[:, 1:2, 1]  # equal scores: the tie order matters
    return data


# ---- get_valid_counts ----------------------------------------------------------------------------------


def test_get_valid_counts_hand_checked():
    counts, out, out_indices = check_op("vision.get_valid_counts", [BOXES, np.float32(0.3)])
    assert counts.tolist() == [4] and out_indices.tolist() == [[0, 1, 2, 3, -1, -1]]
    np.testing.assert_array_equal(out[0, :4], BOXES[0, :4])
    assert (out[0, 4:] == -1).all()
    _, _, no_id = check_op("vision.get_valid_counts", [BOXES, np.float32(0.3)], {"id_index": -1})
    assert no_id.tolist() == [[0, 1, 2, 3, 5, -1]]


@pytest.mark.parametrize("threshold,id_index,score_index", [(0.3, 0, 1), (-1.0, -1, 1), (2.0, 0, 1), (0.5, 1, 0)])
def test_get_valid_counts_everywhere(threshold, id_index, score_index):
    data = _detections(1)
    text = (f"def @main(%d: Tensor[(?, ?, 6), float32], %t: float32) {{\n"
            f"  vision.get_valid_counts(%d, %t, id_index={id_index}, score_index={score_index})\n}}")
    expected = valid_counts_oracle(data, np.float32(threshold), id_index, score_index)
    check_everywhere(text, [data, np.float32(threshold)], expected)
    if threshold > 1:
        assert expected[0].tolist() == [0, 0]  # no box valid


def test_get_valid_counts_rejects_an_index_outside_the_box():
    with pytest.raises(TypeInferenceError, match="score_index=6"):
        get_op("vision.get_valid_counts").type_rel([TensorType((1, 4, 6), "float32"), TensorType((), "float32")],
                                                   {"score_index": 6})


# ---- non_max_suppression --------------------------------------------------------------------------------

NMS_ARGS = "-1, 0.5f"


def _nms_inputs(data):
    batch, anchors, _ = data.shape
    return np.full(batch, anchors, "int32"), np.tile(np.arange(anchors, dtype="int32"), (batch, 1))


# By score: 5 (class -1), 0, 1 (IoU 81/119 with 0), 2, 3 (box 0 in class 1), 4; IoU(5, 0) = 25/100.
@pytest.mark.parametrize("attrs,expected", [
    ({}, [5, 0, 2, 3, 4, -1]),
    ({"force_suppress": True}, [5, 0, 2, 4, -1, -1]),
    ({"id_index": -1}, [5, 0, 2, 4, -1, -1]),
    ({"top_k": 2}, [5, 0, -1, -1, -1, -1]),
    ({"max_output_size": 2}, [5, 0, -1, -1, -1, -1]),
    ({"max_output_size": 0}, [-1] * 6),
])
def test_nms_hand_checked(attrs, expected):
    attrs = dict(attrs)
    max_out = attrs.pop("max_output_size", -1)
    valid_count, indices = _nms_inputs(BOXES)
    box_indices, counts = check_op("vision.non_max_suppression",
                                   [BOXES, valid_count, indices, np.int32(max_out), np.float32(0.5)], attrs)
    assert box_indices.tolist() == [expected] and counts.tolist() == [[sum(i >= 0 for i in expected)]]
    np.testing.assert_array_equal(box_indices, nms_oracle(BOXES, valid_count, indices, max_out, 0.5, **attrs)[0])


# Of 5 rows only the first 4 are valid; by score: 1 (class 1), 3, 2 (IoU 6/22 with 3), 0 (IoU 12/16 with 3).
_PARTLY_VALID = np.array([[[0, 0.6, 0, 0, 4, 4], [1, 0.95, 10, 10, 14, 14], [0, 0.7, 1, 1, 5, 5],
                           [0, 0.8, 0, 0, 4, 3], [0, 0.99, 50, 50, 60, 60]]], "float32")


@pytest.mark.parametrize("iou_threshold,top_k,expected", [
    (0.5, -1, [8, 10, 9, -1, -1]), (0.3, -1, [8, 10, 9, -1, -1]), (0.25, -1, [8, 10, -1, -1, -1]),
    (0.5, 2, [8, 10, -1, -1, -1]),
])
def test_nms_hand_checked_with_a_valid_count_and_indices(iou_threshold, top_k, expected):
    text = ("def @main(%d: Tensor[(?, 5, 6), float32], %c: Tensor[(?), int32], %i: Tensor[(?, 5), int32], "
            "%t: float32) {\n"
            f"  (vision.non_max_suppression(%d, %c, %i, -1, %t, top_k={top_k}),\n"
            f"   vision.non_max_suppression(%d, %c, %d, -1, %t, top_k={top_k}, return_indices=False))\n}}")
    rows = {8: 1, 9: 2, 10: 3}
    boxes = np.full((1, 5, 6), -1, "float32")
    for at, index in enumerate(i for i in expected if i >= 0):
        boxes[0, at] = _PARTLY_VALID[0, rows[index]]
    kept = sum(i >= 0 for i in expected)
    args = [_PARTLY_VALID, np.array([4], "int32"), np.array([[7, 8, 9, 10, -1]], "int32"), np.float32(iou_threshold)]
    check_everywhere(text, args, ((np.array([expected], "int32"), np.array([[kept]], "int32")), boxes))


@pytest.mark.parametrize("attrs", [
    "force_suppress=False, top_k=-1, coord_start=2, score_index=1, id_index=0, return_indices=True, "
    "invalid_to_bottom=False",
    "force_suppress=True, top_k=5, return_indices=True",
    "force_suppress=False, top_k=-1, return_indices=False, invalid_to_bottom=False",
    "force_suppress=False, top_k=7, return_indices=False, invalid_to_bottom=True",
    "id_index=-1, return_indices=False, invalid_to_bottom=True",
])
@pytest.mark.parametrize("max_out,iou_threshold", [(-1, 0.5), (3, 0.3), (0, 0.5), (-1, 0.0), (-1, 1.0)])
def test_get_valid_counts_then_nms_everywhere(attrs, max_out, iou_threshold):
    data = _detections(2)
    text = ("def @main(%d: Tensor[(?, ?, 6), float32], %m: int32, %t: float32) {\n"
            "  %0 = vision.get_valid_counts(%d, 0.25f, id_index=0, score_index=1);\n"
            f"  vision.non_max_suppression(%0.1, %0.0, %0.2, %m, %t, {attrs})\n}}")
    kwargs = dict(kv.strip().split("=") for kv in attrs.split(","))
    kwargs = {k: (v == "True") if v in ("True", "False") else int(v) for k, v in kwargs.items()}
    counts, out, out_indices = valid_counts_oracle(data, np.float32(0.25))
    expected = nms_oracle(out, counts, out_indices, max_out, iou_threshold, **kwargs)
    check_everywhere(text, [data, np.int32(max_out), np.float32(iou_threshold)], expected)


def test_nms_when_no_box_is_valid():
    data = _detections(3)
    text = ("def @main(%d: Tensor[(2, 12, 6), float32]) {\n"
            "  %0 = vision.get_valid_counts(%d, 5f);\n"
            f"  vision.non_max_suppression(%0.1, %0.0, %0.2, {NMS_ARGS})\n}}")
    check_everywhere(text, [data], (np.full((2, 12), -1, "int32"), np.zeros((2, 1), "int32")))


def test_nms_types():
    rel = get_op("vision.non_max_suppression").type_rel
    args = [TensorType((Any(), 8, 6), "float32"), TensorType((Any(),), "int32"), TensorType((Any(), 8), "int32"),
            TensorType((), "int32"), TensorType((), "float32")]
    indices_type, counts_type = rel(args, {}).fields
    assert indices_type.shape[1] == 8 and indices_type.dtype == "int32" and counts_type.shape[1] == 1
    assert rel(args, {"return_indices": False}) == args[0]
    with pytest.raises(TypeInferenceError, match="coord_start"):
        rel(args, {"coord_start": 3})
    with pytest.raises(TypeInferenceError, match="indices"):
        rel(args[:2] + [TensorType((2, 7), "int32")] + args[3:], {})


# ---- all_class_non_max_suppression ----------------------------------------------------------------------


def _class_boxes(seed, batch=2, num_boxes=10, classes=3):
    rng = np.random.default_rng(seed)
    corners = rng.uniform(0, 10, (batch, num_boxes, 2))
    boxes = np.concatenate([corners, corners + rng.uniform(-4, 4, (batch, num_boxes, 2))], axis=2)  # some flipped
    scores = rng.uniform(0, 1, (batch, classes, num_boxes))
    scores[:, :, 3] = scores[:, :, 0]  # ties
    return boxes.astype("float32"), scores.astype("float32")


def test_all_class_nms_hand_checked():
    boxes = np.array([[[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [10, 10, 0, 0]]], "float32")
    scores = np.array([[[0.9, 0.8, 0.7, 0.95], [0.1, 0.5, 0.6, 0.05]]], "float32")
    rows, count = check_op("vision.all_class_non_max_suppression",
                           [boxes, scores, np.int64(5), np.float32(0.5), np.float32(0.2)])
    # class 0: box 3 (box 0 flipped) first, suppresses 0 and 1; class 1: 2 then 1 (0 and 3 below 0.2)
    assert count.tolist() == [4] and rows[:4].tolist() == [[0, 0, 3], [0, 0, 2], [0, 1, 2], [0, 1, 1]]
    assert not rows[4:].any()
    indices, out_scores, counts = check_op("vision.all_class_non_max_suppression",
                                           [boxes, scores, np.int64(1), np.float32(0.5), np.float32(0.2)],
                                           {"output_format": "tensorflow"})
    assert counts.tolist() == [2] and indices[0, :2].tolist() == [[0, 3], [1, 2]]
    np.testing.assert_allclose(out_scores[0, :3], [0.95, 0.6, 0])


@pytest.mark.parametrize("output_format", ["onnx", "tensorflow"])
@pytest.mark.parametrize("max_out,iou_threshold,score_threshold", [(3, 0.4, 0.2), (-1, 0.0, 0.0), (0, 0.5, 0.0),
                                                                   (10, 1.0, 2.0)])
def test_all_class_nms_everywhere(output_format, max_out, iou_threshold, score_threshold):
    boxes, scores = _class_boxes(4)
    text = ("def @main(%b: Tensor[(?, ?, 4), float32], %s: Tensor[(?, 3, ?), float32], %m: Tensor[(1), int64], "
            "%i: float32, %t: float32) {\n"
            f'  vision.all_class_non_max_suppression(%b, %s, %m, %i, %t, output_format="{output_format}")\n}}')
    expected = all_class_oracle(boxes, scores, max_out, iou_threshold, score_threshold, output_format)
    check_everywhere(text, [boxes, scores, np.array([max_out], np.int64), np.float32(iou_threshold),
                            np.float32(score_threshold)], expected)


@pytest.mark.parametrize("max_out,iou_threshold", [(-1, 0.3), (40, 0.1), (-1, 0.0), (-1, -0.5), (70, 1.0)])
def test_all_class_nms_with_many_kept_boxes(max_out, iou_threshold):
    """More kept boxes than one block of the C kernel's IoU loop (32), flipped corners, scores already
    sorted (class 0), tied (class 1, rounded) and unsorted (class 2), a negative IoU threshold (a
    disjoint box has IoU 0 > -0.5: suppressed)."""
    rng = np.random.default_rng(11)
    num_boxes = 150
    corners = rng.uniform(0, 30, (1, num_boxes, 2))
    boxes = np.concatenate([corners, corners + rng.uniform(-3, 3, (1, num_boxes, 2))], axis=2).astype("float32")
    scores = rng.uniform(0, 1, (1, 3, num_boxes))
    scores[0, 0] = np.sort(scores[0, 0])[::-1]
    scores[0, 1] = np.round(scores[0, 1], 1)
    scores = scores.astype("float32")
    text = ("def @main(%b: Tensor[(?, ?, 4), float32], %s: Tensor[(?, 3, ?), float32], %m: Tensor[(1), int64], "
            "%i: float32, %t: float32) {\n  vision.all_class_non_max_suppression(%b, %s, %m, %i, %t)\n}")
    expected = all_class_oracle(boxes, scores, max_out, iou_threshold, 0.05)
    assert expected[1][0] > 3 * 32 or iou_threshold <= 0 or max_out >= 0  # (several blocks of kept boxes)
    check_everywhere(text, [boxes, scores, np.array([max_out], np.int64), np.float32(iou_threshold),
                            np.float32(0.05)], expected)


def test_all_class_nms_static_types():
    rel = get_op("vision.all_class_non_max_suppression").type_rel
    args = [TensorType((2, 10, 4), "float32"), TensorType((2, 3, 10), "float32"), TensorType((1,), "int64"),
            TensorType((), "float32"), TensorType((), "float32")]
    assert [f.shape for f in rel(args, {}).fields] == [(60, 3), (1,)]
    assert [f.shape for f in rel(args, {"output_format": "tensorflow"}).fields] == [(2, 30, 2), (2, 30), (2,)]
    with pytest.raises(TypeInferenceError, match="do not match"):
        rel([args[0], TensorType((2, 3, 9), "float32")] + args[2:], {})


# ---- roi_align ------------------------------------------------------------------------------------------


def _rois(num=5, batch=2, seed=5):
    rng = np.random.default_rng(seed)
    start = rng.uniform(-2, 12, (num, 2))
    size = rng.uniform(0.2, 9, (num, 2))
    return np.concatenate([rng.integers(0, batch, (num, 1)), start, start + size], axis=1).astype("float32")


def test_roi_align_hand_checked():
    data = np.arange(16, dtype="float32").reshape(1, 1, 4, 4)  # value = 4 y + x: bilinear is exact inside
    rois = np.array([[0, 0, 0, 2, 2]], "float32")
    out = check_op("vision.roi_align", [data, rois], {"pooled_size": (1, 1), "spatial_scale": 1.0,
                                                      "sample_ratio": 2})
    # samples at y, x in {0.5, 1.5}: their mean is the value at (1, 1)
    assert out.tolist() == [[[[5.0]]]]
    out = check_op("vision.roi_align", [data, rois], {"pooled_size": 2, "sample_ratio": 1, "mode": "max"})
    assert out.tolist() == [[[[2.5, 3.5], [6.5, 7.5]]]]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("sample_ratio,spatial_scale,pooled", [(-1, 1.0, (2, 3)), (2, 0.5, (3, 3)), (1, 1.0, (1, 1))])
def test_roi_align_everywhere(layout, mode, sample_ratio, spatial_scale, pooled):
    rng = np.random.default_rng(6)
    data = rng.standard_normal((2, 3, 10, 9) if layout == "NCHW" else (2, 10, 9, 3)).astype("float32")
    rois = _rois()
    text = ("def @main(%d: Tensor[(?, ?, ?, ?), float32], %r: Tensor[(?, 5), float32]) {\n"
            f"  vision.roi_align(%d, %r, pooled_size=[{pooled[0]}, {pooled[1]}], spatial_scale={spatial_scale}f, "
            f'sample_ratio={sample_ratio}, layout="{layout}", mode="{mode}")\n}}')
    expected = roi_align_oracle(data, rois, pooled, spatial_scale, sample_ratio, layout, mode)
    check_everywhere(text, [data, rois], expected, rtol=1e-5, atol=1e-5)


def test_roi_align_rejects_a_batch_index_outside_the_data():
    text = ("def @main(%d: Tensor[(1, 1, 4, 4), float32], %r: Tensor[(1, 5), float32]) {\n"
            "  vision.roi_align(%d, %r, pooled_size=[1, 1])\n}")
    mod = tv.parse('#[version = "0.0.5"]\n' + text)
    args = np.zeros((1, 1, 4, 4), "float32"), np.array([[1, 0, 0, 2, 2]], "float32")
    with pytest.raises(ShapeError, match="batch index"):
        tv.create_executor("debug", mod).evaluate()(*args)
    with pytest.raises(ExecutionError):
        tv.vm.VirtualMachine(tv.vm.compile(mod, target="c")).invoke("main", *args)


@pytest.mark.parametrize("count", [1, 2, 3])
def test_roi_align_in_chunks_at_any_thread_count(kernel_threads, count):
    """37 regions x 16 channels x 9 bins: above the parallel threshold, in chunks on the kernels' pool
    (tv_lib_run); no region, and a region of a batch outside the data (an error from whichever chunk)."""
    text = ("def @main(%d: Tensor[(?, ?, ?, ?), float32], %r: Tensor[(?, 5), float32]) {\n"
            '  vision.roi_align(%d, %r, pooled_size=[3, 3], spatial_scale=0.5f, sample_ratio=2, mode="avg")\n}')
    mod = tv.parse('#[version = "0.0.5"]\n' + text)
    vm = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c"))
    kernel_threads(count)
    rng = np.random.default_rng(count)
    data = rng.standard_normal((2, 16, 11, 13)).astype("float32")
    for rois in (_rois(num=37, seed=count), _rois(num=0)):
        got = vm.invoke("main", data, rois).numpy()
        np.testing.assert_allclose(got, roi_align_oracle(data, rois, (3, 3), 0.5, 2), rtol=1e-5, atol=1e-5)
    rois = _rois(num=37, seed=count)
    rois[29, 0] = 2  # (batch 2 of a batch of 2)
    with pytest.raises(ExecutionError):
        vm.invoke("main", data, rois)


# ---- sparse_fill_empty_rows -----------------------------------------------------------------------------

SPARSE_CASES = {
    "some rows empty": ([[0, 1], [0, 3], [2, 0], [4, 2]], [1.0, 2.0, 3.0, 4.0], [6, 5]),
    "no row empty": ([[0, 0], [1, 1], [1, 2]], [1.0, 2.0, 3.0], [2, 3]),
    "all rows empty": (np.zeros((0, 2)), [], [3, 4]),
    "3-d": ([[1, 0, 1], [1, 1, 0], [3, 2, 2]], [5.0, 6.0, 7.0], [4, 3, 3]),
}


def test_sparse_fill_empty_rows_hand_checked():
    indices, values, empty = check_op(
        "sparse_fill_empty_rows",
        [np.array([[0, 1], [2, 0]], np.int64), np.array([7, 8], "int32"), np.array([4, 2], np.int64),
         np.array(-1, "int32")], dynamic=True)
    assert indices.tolist() == [[0, 1], [1, 0], [2, 0], [3, 0]] and values.tolist() == [7, -1, 8, -1]
    assert empty.tolist() == [False, True, False, True]


@pytest.mark.parametrize("case", sorted(SPARSE_CASES))
def test_sparse_fill_empty_rows_everywhere(case):
    indices, values, dense_shape = SPARSE_CASES[case]
    ndim = len(dense_shape)
    indices, values = np.array(indices, np.int64).reshape(-1, ndim), np.array(values, "float32")
    dense_shape, default = np.array(dense_shape, np.int64), np.float32(-5)
    text = (f"def @main(%i: Tensor[(?, {ndim}), int64], %v: Tensor[(?), float32], %s: Tensor[({ndim}), int64], "
            "%d: float32) {\n  sparse_fill_empty_rows(%i, %v, %s, %d)\n}")
    expected = sparse_fill_oracle(indices, values, dense_shape, default)
    check_everywhere(text, [indices, values, dense_shape, default], expected)


def test_sparse_fill_empty_rows_rejects_unsorted_rows():
    text = ("def @main(%i: Tensor[(?, 2), int64], %v: Tensor[(?), float32], %s: Tensor[(2), int64]) {\n"
            "  sparse_fill_empty_rows(%i, %v, %s, 0f)\n}")
    mod = tv.parse('#[version = "0.0.5"]\n' + text)
    args = np.array([[2, 0], [0, 1]], np.int64), np.ones(2, "float32"), np.array([3, 3], np.int64)
    with pytest.raises(ShapeError, match="ascending"):
        tv.create_executor("debug", mod).evaluate()(*args)
    with pytest.raises(ShapeError, match="ascending"):
        tv.vm.VirtualMachine(tv.vm.compile(mod, target="c")).invoke("main", *args)


def test_sparse_fill_empty_rows_types():
    rel = get_op("sparse_fill_empty_rows").type_rel
    args = [TensorType((Any(), 2), "int64"), TensorType((Any(),), "float32"), TensorType((2,), "int64"),
            TensorType((), "float32")]
    indices, values, empty = rel(args, {}).fields
    assert indices.shape[1] == 2 and isinstance(indices.shape[0], Any) and empty.dtype == "bool"
    assert rel(args, {}, [None, None, np.array([7, 3]), None]).fields[2].shape == (7,)
    with pytest.raises(TypeInferenceError, match="default_value"):
        rel(args[:3] + [TensorType((), "int32")], {})


def test_a_detection_program_runs_on_target_c_without_numpy_fallbacks():
    text = ("def @main(%d: Tensor[(1, 6, 6), float32], %f: Tensor[(1, 2, 8, 8), float32]) {\n"
            "  %0 = vision.get_valid_counts(%d, 0.3f);\n"
            "  %1 = vision.non_max_suppression(%0.1, %0.0, %0.2, -1, 0.5f, return_indices=False);\n"
            "  %2 = strided_slice(%1, begin=[0, 0, 2], end=[1, 6, 6]);\n"
            "  %3 = reshape(%2, newshape=[6, 4]);\n"
            '  %4 = concatenate((zeros(shape=[6, 1], dtype="float32"), %3), axis=1);\n'
            "  vision.roi_align(%f, %4, pooled_size=[2, 2], spatial_scale=0.5f)\n}")
    feature = np.random.default_rng(7).standard_normal((1, 2, 8, 8)).astype("float32")
    results = run_everywhere(text, BOXES, feature)
    np.testing.assert_allclose(results["c"], results["debug"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(results["python"], results["debug"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_other_float_dtypes_everywhere(dtype):
    data = _detections(8).astype(dtype)
    text = (f"def @main(%d: Tensor[(?, ?, 6), {dtype}], %f: Tensor[(2, 3, 6, 7), {dtype}], "
            f"%r: Tensor[(?, 5), {dtype}], %t: {dtype}) {{\n"
            "  %0 = vision.get_valid_counts(%d, %t);\n"
            "  %1 = vision.non_max_suppression(%0.1, %0.0, %0.2, 4, 0.4f, return_indices=False, "
            "invalid_to_bottom=True);\n"
            '  (%1, vision.roi_align(%f, %r, pooled_size=[2, 2], layout="NCHW", mode="max"))\n}')
    feature = np.random.default_rng(9).standard_normal((2, 3, 6, 7)).astype(dtype)
    rois = _rois(batch=2).astype(dtype)
    counts, out, out_indices = valid_counts_oracle(data, 0.25)
    boxes = nms_oracle(out, counts, out_indices, 4, 0.4, return_indices=False, invalid_to_bottom=True)
    pooled = roi_align_oracle(feature.astype("float64"), rois.astype("float64"), (2, 2), 1.0, mode="max")
    tolerance = 2e-3 if dtype == "float16" else 1e-9
    check_everywhere(text, [data, feature, rois, np.array(0.25, dtype)], (boxes, pooled.astype(dtype)),
                     rtol=tolerance, atol=tolerance)


def test_a_threshold_tensor_of_more_than_one_value_is_an_error():
    text = ("def @main(%d: Tensor[(1, 6, 6), float32], %t: Tensor[(?), float32]) {\n"
            "  %0 = vision.get_valid_counts(%d, 0f);\n"
            "  vision.non_max_suppression(%0.1, %0.0, %0.2, -1, %t)\n}")
    mod = tv.parse('#[version = "0.0.5"]\n' + text)
    args = BOXES, np.array([0.5, 0.6], "float32")
    with pytest.raises(ShapeError, match="iou_threshold must hold one value"):
        tv.create_executor("debug", mod).evaluate()(*args)
    with pytest.raises(ShapeError, match="iou_threshold must hold one value"):
        tv.vm.VirtualMachine(tv.vm.compile(mod, target="c")).invoke("main", *args)


def test_aot_links_the_vision_library_functions():
    import tensorvm.aot as aot

    mod = tv.parse('#[version = "0.0.5"]\n'
                   "def @main(%d: Tensor[(1, 6, 6), float32], %f: Tensor[(1, 2, 8, 8), float32], "
                   "%r: Tensor[(3, 5), float32]) {\n"
                   "  %0 = vision.get_valid_counts(%d, 0.3f);\n"
                   "  %1 = vision.non_max_suppression(%0.1, %0.0, %0.2, -1, 0.5f);\n"
                   '  (%1.0, %1.1, vision.roi_align(%f, %r, pooled_size=[2, 2], mode="max"))\n}')
    feature = np.random.default_rng(10).standard_normal((1, 2, 8, 8)).astype("float32")
    rois = np.array([[0, 0, 0, 4, 4], [0, 1, 2, 7, 5], [0, 3, 3, 3.5, 3.5]], "float32")
    result = aot.build(mod, name="vision").load()(BOXES, feature, rois)
    counts, out, out_indices = valid_counts_oracle(BOXES, np.float32(0.3))
    expected = (*nms_oracle(out, counts, out_indices, -1, 0.5),
                roi_align_oracle(feature, rois, (2, 2), 1.0, mode="max"))
    for got, want in zip(result, expected, strict=True):
        np.testing.assert_allclose(np.asarray(got.numpy() if hasattr(got, "numpy") else got), want, rtol=1e-5,
                                   atol=1e-6)


def test_nms_orders_minus_infinity_before_nan():
    # NaN scores sort after every number, -inf included, on every executor (regression: the NumPy kernel
    # took NaN for +inf and tied it with -inf)
    data = np.array([[[0, np.nan, 0, 0, 1, 1], [0, -np.inf, 5, 5, 6, 6], [0, 0.5, 9, 9, 10, 10]]], "float32")
    text = ("def @main(%d: Tensor[(1, 3, 6), float32], %c: Tensor[(1), int32], %i: Tensor[(1, 3), int32]) {\n"
            "  vision.non_max_suppression(%d, %c, %i, -1, 0.5f)\n}")
    args = [data, np.array([3], "int32"), np.array([[0, 1, 2]], "int32")]
    check_everywhere(text, args, (np.array([[2, 1, 0]], "int32"), np.array([[3]], "int32")))


def test_get_valid_counts_compares_a_float64_threshold_exactly():
    # float32 0.1 is just above float64 0.1: the box is valid on every executor (regression: the NumPy
    # kernel rounded the threshold to float32 first)
    data = np.array([[[0, 0.1, 0, 0, 1, 1]]], "float32")
    text = "def @main(%d: Tensor[(1, 1, 6), float32], %t: float64) { vision.get_valid_counts(%d, %t) }"
    check_everywhere(text, [data, np.float64(0.1)], (np.array([1], "int32"), data, np.array([[0]], "int32")))


def test_roi_align_rejects_coordinates_that_are_not_finite():
    text = ("def @main(%d: Tensor[(1, 1, 4, 4), float32], %r: Tensor[(1, 5), float32]) {\n"
            "  vision.roi_align(%d, %r, pooled_size=[1, 1])\n}")
    mod = tv.parse('#[version = "0.0.5"]\n' + text)
    args = np.zeros((1, 1, 4, 4), "float32"), np.array([[0, 0, 0, np.inf, 2]], "float32")
    with pytest.raises(ShapeError, match="finite"):
        tv.create_executor("debug", mod).evaluate()(*args)
    with pytest.raises(ExecutionError):
        tv.vm.VirtualMachine(tv.vm.compile(mod, target="c")).invoke("main", *args)


def test_all_class_nms_takes_the_iou_in_double():
    # The IoU of these float32 boxes is 0.0399283241... in double, one float32 ulp more when taken in
    # float32: at a float64 threshold of the double value the second box is kept everywhere (regression:
    # the NumPy kernel took the IoU in float32 and suppressed it)
    boxes = np.array([[[13 / 11, 35 / 11, 10 / 11, 9 / 11], [24 / 13, 1 / 13, 3 / 13, 15 / 13]]], "float32")
    threshold = iou(*boxes[0].astype(np.float64).tolist())
    text = ("def @main(%b: Tensor[(1, 2, 4), float32], %s: Tensor[(1, 1, 2), float32], %t: float64) {\n"
            "  vision.all_class_non_max_suppression(%b, %s, 5, %t, -1f)\n}")
    scores = np.array([[[0.9, 0.8]]], "float32")
    check_everywhere(text, [boxes, scores, np.float64(threshold)],
                     (np.array([[0, 0, 0], [0, 0, 1]], np.int64), np.array([2], np.int64)))
