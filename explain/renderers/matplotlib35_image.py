"""An image that rasterises as matplotlib 3.5.2's did: the paper's environment (js-d/auditing-vis
pinned matplotlib 3.5.2), whose pixels the ``captum_figure`` renderer reproduces by default.

Between 3.5.2 and the installed matplotlib, ``AxesImage._make_image`` changed three things that
move the pixels of captum's figure (tests/test_explain_protocol.py measures each):

- the order: 3.5.2 resampled a scalar image's *data*, then colour-mapped it; since 3.10 the
  default ``interpolation_stage = "auto"`` colour-maps first when upsampling by less than 3x
  (the paper's 224-px map in its 465-px axes, the demo's 64 px in 74);
- the geometry: 3.5.2 rounded the output size *up* and stretched the transform to fill it,
  drawing at the unrounded corner; since 3.6 the corners are rounded to the nearest pixel;
- the data stage: 3.5.2 rescaled the data to [0.1, 0.9] before resampling and back after
  (rounding differs in the last bits, which can move a colour-map bin).

``_make_image`` below is 3.5.2's (``lib/matplotlib/image.py``, matplotlib's licence), reduced to
what an Agg figure draws for a 2-D scalar image: the sampled path with interpolation at the data
stage. Its resampling is 3.5.2's ``_resample`` (without the mirror 3.9 added for "nearest");
the Agg resampler it calls did not change.
"""
from __future__ import annotations

import math

import numpy as np
from matplotlib import _image, cbook, colors as mcolors
from matplotlib.image import _interpd_, AxesImage
from matplotlib.transforms import Affine2D, Bbox, IdentityTransform

OFFSET, FRACTION = 0.1, 0.8  # 3.5.2 resampled data rescaled to [0.1, 0.9]


def rasterise_as_matplotlib_3_5(image: AxesImage) -> None:
    """Make an image that ``imshow`` (here, captum's call) set up rasterise as in 3.5.2,
    keeping everything the call set (data, colour map, norm, alpha, extent)."""
    if type(image) is not AxesImage:
        raise TypeError(f"expected a matplotlib AxesImage, got {type(image).__name__}")
    image.__class__ = Matplotlib35Image  # only _make_image differs; no state to convert


class Matplotlib35Image(AxesImage):
    """An AxesImage whose scalar data is resampled, then colour-mapped, laid out as 3.5.2 did."""

    def _make_image(self, A, in_bbox, out_bbox, clip_bbox, magnification=1.0,
                    unsampled=False, round_to_pixel_border=True):
        if unsampled or A.ndim != 2 or self.get_interpolation() not in ("antialiased", "auto"):
            raise ValueError("Matplotlib35Image draws 2-D scalar data with interpolation "
                             f"'antialiased' on a raster backend only; got data {A.shape}, "
                             f"interpolation {self.get_interpolation()!r}, unsampled={unsampled}")
        clipped_bbox = Bbox.intersection(out_bbox, clip_bbox)
        if clipped_bbox is None:
            return None, 0, 0, None
        out_width_base = clipped_bbox.width * magnification
        out_height_base = clipped_bbox.height * magnification
        if out_width_base == 0 or out_height_base == 0:
            return None, 0, 0, None
        t0 = (Affine2D().translate(0, -A.shape[0]).scale(1, -1) if self.origin == "upper"
              else IdentityTransform())
        t0 += (Affine2D().scale(in_bbox.width / A.shape[1], in_bbox.height / A.shape[0])
               .translate(in_bbox.x0, in_bbox.y0) + self.get_transform())
        t = t0 + Affine2D().translate(-clipped_bbox.x0, -clipped_bbox.y0).scale(magnification)
        # 3.5.2's geometry: round the size up and stretch the image to fill it.
        if t.is_affine and round_to_pixel_border and (out_width_base % 1.0 != 0.0
                                                      or out_height_base % 1.0 != 0.0):
            out_width, out_height = math.ceil(out_width_base), math.ceil(out_height_base)
            t += Affine2D().scale(1.0 + (out_width - out_width_base) / out_width_base,
                                  1.0 + (out_height - out_height_base) / out_height_base)
        else:
            out_width, out_height = int(out_width_base), int(out_height_base)
        out_shape = (out_height, out_width)

        # The data stage: resample the data rescaled to [OFFSET, OFFSET + FRACTION], then
        # colour-map it.
        a_min, a_max = A.min(), A.max()
        if a_min is np.ma.masked:
            a_min, a_max = np.int32(0), np.int32(1)
        if A.dtype.kind == "f":
            scaled_dtype = np.dtype(np.float64 if A.dtype.itemsize > 4 else np.float32)
        else:
            span = a_max.astype(np.float64) - a_min.astype(np.float64)
            scaled_dtype = np.float64 if span > 1e8 else np.float32
        A_scaled = np.array(A, dtype=scaled_dtype)
        self.norm.autoscale_None(A)
        dv = np.float64(self.norm.vmax) - np.float64(self.norm.vmin)
        vmid = np.float64(self.norm.vmin) + dv / 2
        fact = 1e7 if scaled_dtype == np.float64 else 1e4
        newmin, newmax = vmid - dv * fact, vmid + dv * fact
        newmin = None if newmin < a_min else newmin
        newmax = None if newmax > a_max else newmax
        if newmin is not None:
            a_min = np.float64(newmin)
        if newmax is not None:
            a_max = np.float64(newmax)
        if newmax is not None or newmin is not None:
            np.clip(A_scaled, newmin, newmax, out=A_scaled)
        vmin, vmax = self.norm.vmin, self.norm.vmax
        if vmin is np.ma.masked:
            vmin, vmax = a_min, a_max
        vrange = np.array([vmin, vmax], dtype=scaled_dtype)
        A_scaled -= a_min
        vrange -= a_min
        a_min = a_min.astype(scaled_dtype).item()
        a_max = a_max.astype(scaled_dtype).item()
        if a_min != a_max:
            A_scaled /= ((a_max - a_min) / FRACTION)
            vrange /= ((a_max - a_min) / FRACTION)
        A_scaled += OFFSET
        vrange += OFFSET
        A_resampled = _resample_3_5(self, A_scaled, out_shape, t)
        A_resampled -= OFFSET
        vrange -= OFFSET
        if a_min != a_max:
            A_resampled *= ((a_max - a_min) / FRACTION)
            vrange *= ((a_max - a_min) / FRACTION)
        A_resampled += a_min
        vrange += a_min
        if isinstance(self.norm, mcolors.NoNorm):
            A_resampled = A_resampled.astype(A.dtype)
        mask = (np.where(A.mask, np.float32(np.nan), np.float32(1))
                if A.mask.shape == A.shape else np.ones_like(A, np.float32))
        out_alpha = _resample_3_5(self, mask, out_shape, t, resample=True)
        out_mask = np.isnan(out_alpha)
        out_alpha[out_mask] = 1
        alpha = self.get_alpha()
        if alpha is not None and np.ndim(alpha) > 0:
            out_alpha *= _resample_3_5(self, alpha, out_shape, t, resample=True)
        resampled_masked = np.ma.masked_array(A_resampled, out_mask)
        s_vmin, s_vmax = vrange
        if isinstance(self.norm, mcolors.LogNorm) and s_vmin <= 0:
            s_vmin = np.finfo(scaled_dtype).eps
        with self.norm.callbacks.blocked(), cbook._setattr_cm(self.norm, vmin=s_vmin,
                                                              vmax=s_vmax):
            output = self.norm(resampled_masked)
        output = self.to_rgba(output, bytes=True, norm=False)
        alpha_channel = output[:, :, 3]
        alpha_channel[:] = np.asarray(  # truncated, as 3.5.2 did
            np.asarray(alpha_channel, np.float32) * out_alpha * self._get_scalar_alpha(),
            np.uint8)
        return output, clipped_bbox.x0, clipped_bbox.y0, t


def _resample_3_5(image, data, out_shape, transform, *, resample=None):
    """3.5.2's ``_resample``: "antialiased" is Hanning unless the image is upsampled by exactly
    1x or 2x or by more than 3x, where it is "nearest" (not mirrored, as 3.9 began to)."""
    pos = np.array([[0, 0], [data.shape[1], data.shape[0]]])
    disp = transform.transform(pos)
    dispx, dispy = np.abs(np.diff(disp[:, 0])), np.abs(np.diff(disp[:, 1]))
    nearest = ((dispx > 3 * data.shape[1] or dispx == data.shape[1]
                or dispx == 2 * data.shape[1])
               and (dispy > 3 * data.shape[0] or dispy == data.shape[0]
                    or dispy == 2 * data.shape[0]))
    out = np.zeros(out_shape + data.shape[2:], data.dtype)
    _image.resample(data, out, transform, _interpd_["nearest" if nearest else "hanning"],
                    image.get_resample() if resample is None else resample, 1.0,
                    image.get_filternorm(), image.get_filterrad())
    return out
