"""Measure the built website as a reader sees it: what overflows the column, on a laptop and a phone.

Two measurements of ``_build/html`` (build the book first):

- **static** (no browser): every text output of a chapter (a ``<pre>`` in a cell's output) is
  counted in characters per line and compared with the number of characters that fit on a line
  of the column at a laptop (1366 px) and a phone (390 px) width (:data:`COLUMN_CHARS`, measured
  in Chromium on this theme by ``python book/site_check.py column``), and so is every source line
  of a visible code cell (:data:`CODE_CHARS`, :func:`wide_code_lines`); every ``<img>`` is checked
  for a fixed height (:func:`inline_heights`), the stylesheet for a rule forcing one
  (:func:`css_forced_heights`), and the TeX of every page for a macro that is neither a MathJax
  built-in, nor in the configuration, nor defined on the page (:func:`undefined_macros`).
  ``tests/book/test_site.py`` runs these on every build.
- **browser** (headless Chromium, when installed): each page is loaded in a viewport of the given
  width, and a script measures, once MathJax has typeset the page, every text output, code cell,
  table, display equation, image, animation player and widget: how much of it the column edge
  hides, how much an image is stretched or distorted (shown at another aspect ratio than its
  PNG), whether an equation's number is drawn over the equation, whether the page itself scrolls
  sideways, and what TeX MathJax left undefined (drawn in red).
  Chromium is driven over the DevTools protocol on a pipe (no driver package). MathJax and the
  widget manager come from the CDNs the pages name; offline, pass ``--assets DIR``: a folder with
  the npm packages ``mathjax@3``, ``@jupyter-widgets/html-manager@1.0.6`` and ``requirejs@2.3.4``
  unpacked as ``DIR/mathjax``, ``DIR/html-manager`` and ``DIR/requirejs`` (``npm pack NAME`` and
  ``tar xzf``); a copy of the site that loads them from there is then served. Without them,
  equations stay TeX source and are reported as not measured.

Usage, from the repository root::

    python book/site_check.py static                  # wide text outputs per chapter
    python book/site_check.py browser [PAGES] --width 1366 --width 390 [--assets DIR] [--json FILE]
    python book/site_check.py shot book/ch01_associative_memory.html --width 1366 --height 768 \\
        --scroll-to .widget-vbox --out shot.png [--assets DIR]
    python book/site_check.py column                  # re-measure COLUMN_CHARS
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"

#: characters of a cell's text output that fit on one line of the article column, by viewport width
#: in px (the theme's monospace at its output size, the output block's padding subtracted), as
#: measured by ``python book/site_check.py column`` in Chromium on the built site
COLUMN_CHARS = {1366: 86, 390: 38}

#: characters of a visible code cell's source line that fit the column at 1366 px (the theme's
#: code font at 0.83em of the body, 13.3 px, in a 721 px box: book/_static/reader.css), measured in
#: Chromium (``python book/site_check.py column``); the book's limit of 88
#: characters a line keeps every visible cell within it
CODE_CHARS = {1366: 90}

#: the CDN addresses a built page loads, and where a local copy of each npm package keeps them
CDN_ASSETS = {
    "https://cdn.jsdelivr.net/npm/mathjax@3/es5/": "mathjax/es5/",
    "https://cdnjs.cloudflare.com/ajax/libs/require.js/2.3.4/require.min.js": "requirejs/require.js",
    "https://cdn.jsdelivr.net/npm/@jupyter-widgets/html-manager@1.0.6/dist/": "html-manager/dist/",
    "https://cdn.jsdelivr.net/npm/": "npm/",
}


#: the words of a verdict (the book's reproduction tables); an output carrying one must fit a phone
VERDICT = re.compile(r"\b(?:agree|agrees|disagree|disagrees|not resolvable|not testable|unresolved)\b", re.I)


def chapter_pages(html_dir: Path = HTML) -> list[Path]:
    """The built pages of the book's chapters and back matter (``book/*.html``)."""
    return sorted((html_dir / "book").glob("*.html"))


# ----------------------------------------------------------------------------- static measurement
def _section_title(el) -> str:
    section = el.find_parent("section")
    head = section.find(re.compile("^h[1-6]$")) if section is not None else None
    return re.sub(r"\s+", " ", head.get_text(" ", strip=True)).replace("#", "").strip()[:60] if head else ""


def output_blocks(page_html: str) -> list[dict]:
    """The text outputs of a built page: for each ``<pre>`` in a cell's output, the width of its
    longest line in characters, its number of lines, whether it sits in a collapsed (``<details>``)
    output or wraps (a cell tagged ``wrap-output``, whose long lines wrap at the column edge:
    ``book/_static/reader.css``), the section it is in, and its first line."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(page_html, "html.parser")
    blocks = []
    for pre in soup.select("div.cell_output pre"):
        lines = pre.get_text().rstrip("\n").split("\n")
        text = "\n".join(lines)
        blocks.append({"chars": max((len(line.expandtabs()) for line in lines), default=0),
                       "lines": len(lines), "section": _section_title(pre), "verdict": bool(VERDICT.search(text)),
                       "collapsed": pre.find_parent("details") is not None,
                       "wraps": pre.find_parent("div", class_="tag_wrap-output") is not None,
                       "first": next((ln.strip() for ln in lines if ln.strip()), "")[:70]})
    return blocks


def static_overflow(html_dir: Path = HTML, widths=tuple(COLUMN_CHARS)) -> dict:
    """``{page name: {"outputs": n, width: [blocks wider than the column at that width],
    "verdicts": {width: [such blocks that carry a verdict]}}}`` (collapsed and wrapping outputs
    excluded: nothing of them is cut)."""
    report = {}
    for page in chapter_pages(html_dir):
        blocks = [b for b in output_blocks(page.read_text(encoding="utf-8")) if not (b["collapsed"] or b["wraps"])]
        report[page.name] = {"outputs": len(blocks), "verdicts": {}}
        for w in widths:
            report[page.name][w] = [b for b in blocks if b["chars"] > COLUMN_CHARS[w]]
            report[page.name]["verdicts"][w] = [b for b in report[page.name][w] if b["verdict"]]
    return report


def print_static(report: dict) -> None:
    widths = [k for k in next(iter(report.values())) if isinstance(k, int)]
    print(f"{'page':42s} {'outputs':>7s} " + " ".join(f"{'>' + str(w) + ' px':>9s}" for w in widths)
          + " " + " ".join(f"{'verdict>' + str(w):>12s}" for w in widths))
    for name, r in report.items():
        print(f"{name:42s} {r['outputs']:7d} " + " ".join(f"{len(r[w]):9d}" for w in widths)
              + " " + " ".join(f"{len(r['verdicts'][w]):12d}" for w in widths))
    for name, r in report.items():
        if r[widths[0]]:
            print(f"\n{name}: wider than the column at {widths[0]} px ({COLUMN_CHARS[widths[0]]} characters)")
            for b in r[widths[0]]:
                print(f"  {b['chars']:4d} ch x {b['lines']:3d} lines  [{b['section'][:40]}]  {b['first']}")


# ----------------------------------------------------------------------------- static checks of the built HTML
#: Every TeX macro MathJax 3 knows without a definition in the page: the macros of the packages the
#: ``tex-chtml`` component that Sphinx loads brings (base, ams, newcommand, noundefined, require,
#: autoload, configmacros) and those that autoload loads on first use (boldsymbol, cancel, color,
#: braket, ...). Generated from mathjax-full 3.2.2's own tables by :data:`MATHJAX_LIST_JS`
#: (``npm install mathjax-full@3`` in a folder, then ``node list.js`` there). A macro not in this
#: list, not in ``_config.yml``'s ``mathjax3_config`` macros and not defined on the page (a
#: ``\newcommand`` line) is shown as red text on the site.
MATHJAX_MACROS = frozenset("""
And Arrowvert Bbb Bbbk Big Bigg Biggl Biggm Biggr Bigl Bigm Bigr Box Bra Braket Bumpeq Cap Cup
DeclareMathOperator Delta Diamond Doteq Downarrow Finv Game Gamma Huge Im Join Ket Ketbra LARGE
LaTeX Lambda Large Leftarrow Leftrightarrow Lleftarrow Longleftarrow Longleftrightarrow
Longrightarrow Lsh Newextarrow Omega Phi Pi Pr Psi Re Rightarrow Rrightarrow Rsh Rule S Set
Sigma Space Subset Supset TeX Theta Tiny Uparrow Updownarrow Upsilon Vdash Vert Vvdash Xi above
abovewithdelims acute aleph alpha amalg angle approx approxeq arccos arcsin arctan arg array
arrowvert ast asymp atop atopwithdelims backepsilon backprime backsim backsimeq backslash bar
barwedge bbFont bbox bcancel because begin beta beth between bf big bigcap bigcirc bigcup bigg
biggl biggm biggr bigl bigm bigodot bigoplus bigotimes bigr bigsqcup bigstar bigtriangledown
bigtriangleup biguplus bigvee bigwedge binom blacklozenge blacksquare blacktriangle
blacktriangledown blacktriangleleft blacktriangleright bmod boldsymbol bot bowtie boxdot boxed
boxminus boxplus boxtimes bra brace bracevert brack braket breve buildrel bullet bumpeq cal
cancel cancelto cap cases cdot cdotp cdots ce centerdot cfrac check checkmark chi choose circ
circeq circlearrowleft circlearrowright circledR circledS circledast circledcirc circleddash
class clubsuit colon color colorbox complement cong coprod cos cosh cot coth cr csc cssId cup
curlyeqprec curlyeqsucc curlyvee curlywedge curvearrowleft curvearrowright dagger daleth
dashleftarrow dashrightarrow dashv dbinom ddagger ddddot dddot ddot ddots def definecolor deg
delta det dfrac diagdown diagup diamond diamondsuit digamma dim displaylines displaystyle div
divideontimes divsymbol dot doteq doteqdot dotplus dots dotsb dotsc dotsi dotsm dotso
doublebarwedge doublecap doublecup downarrow downdownarrows downharpoonleft downharpoonright ell
emptyset enclose end enspace epsilon eqalign eqalignno eqcirc eqref eqsim eqslantgtr eqslantless
equiv eta eth exists exp fallingdotseq fbox fcolorbox flat forall frac frak framebox frown gamma
gcd ge genfrac geq geqq geqslant gets gg ggg gggtr gimel gnapprox gneq gneqq gnsim grave gt
gtrapprox gtrdot gtreqless gtreqqless gtrless gtrsim gvertneqq hat hbar hbox hdashline heartsuit
hfil hfill hfilll hline hom hookleftarrow hookrightarrow hphantom href hskip hslash hspace huge
idotsint iff iiiint iiint iint imath impliedby implies in inf infty injlim int intercal intop
iota it jmath kappa ker kern ket ketbra lVert label lambda land langle large lbrace lbrack lceil
ldotp ldots le leadsto left leftarrow leftarrowtail leftharpoondown leftharpoonup leftleftarrows
leftrightarrow leftrightarrows leftrightharpoons leftrightsquigarrow leftroot leftthreetimes leq
leqalignno leqq leqslant lessapprox lessdot lesseqgtr lesseqqgtr lessgtr lesssim let lfloor lg
lgroup lhd lim liminf limits limsup ll llap llcorner lll llless lmoustache ln lnapprox lneq
lneqq lnot lnsim log longleftarrow longleftrightarrow longmapsto longrightarrow looparrowleft
looparrowright lor lower lozenge lrcorner lt ltimes lvert lvertneqq maltese mapsto mathbb mathbf
mathbfcal mathbffrak mathbfit mathbfscr mathbfsf mathbfsfit mathbfsfup mathbfup mathbin mathcal
mathchoice mathclose mathfrak mathinner mathit mathnormal mathop mathopen mathord mathpunct
mathrel mathring mathrm mathscr mathsf mathsfit mathsfup mathstrut mathtip mathtt mathup matrix
max mbox measuredangle mho mid middle min mit mkern mmlToken mod models moveleft moveright mp
mskip mspace mu multimap nLeftarrow nLeftrightarrow nRightarrow nVDash nVdash nabla natural
ncong ne nearrow neg negmedspace negthickspace negthinspace neq newcommand newenvironment
newline nexists ngeq ngeqq ngeqslant ngtr ni nleftarrow nleftrightarrow nleq nleqq nleqslant
nless nmid nobreakspace nolimits nonscript nonumber normalsize not notChar notag notin nparallel
nprec npreceq nrightarrow nshortmid nshortparallel nsim nsubseteq nsubseteqq nsucc nsucceq
nsupseteq nsupseteqq ntriangleleft ntrianglelefteq ntriangleright ntrianglerighteq nu nvDash
nvdash nwarrow odot oint oldstyle omega omicron ominus operatorname oplus oslash otimes over
overbrace overleftarrow overleftrightarrow overline overparen overrightarrow overset
overunderset overwithdelims owns parallel partial perp phantom phi pi pitchfork pm pmatrix pmb
pmod pod prec precapprox preccurlyeq preceq precnapprox precneqq precnsim precsim prime prod
projlim propto psi pu qquad quad rVert raise rangle rbrace rbrack rceil ref renewcommand
renewenvironment require restriction rfloor rgroup rhd rho right rightarrow rightarrowtail
rightharpoondown rightharpoonup rightleftarrows rightleftharpoons rightrightarrows
rightsquigarrow rightthreetimes risingdotseq rlap rm rmoustache root rtimes rule rvert scr
scriptscriptstyle scriptsize scriptstyle searrow sec set setminus sf sharp shortmid
shortparallel shoveleft shoveright sideset sigma sim simeq sin sinh skew small smallfrown
smallint smallsetminus smallsmile smash smile space spadesuit sphericalangle sqcap sqcup sqrt
sqsubset sqsubseteq sqsupset sqsupseteq square stackbin stackrel star strut style subset
subseteq subseteqq subsetneq subsetneqq substack succ succapprox succcurlyeq succeq succnapprox
succneqq succnsim succsim sum sup supset supseteq supseteqq supsetneq supsetneqq surd swarrow
symbb symbf symbfcal symbffrak symbfit symbfscr symbfsf symbfsfit symbfsfup symbfup symcal
symfrak symit symnormal symrm symscr symsf symsfit symsfup symtt symup tag tan tanh tau tbinom
text textbf textcolor textit textnormal textrm textsf textstyle texttip texttt textup tfrac
therefore theta thickapprox thicksim thinspace tilde times tiny to toggle top triangle
triangledown triangleleft trianglelefteq triangleq triangleright trianglerighteq tt
twoheadleftarrow twoheadrightarrow ulcorner underbrace underleftarrow underleftrightarrow
underline underparen underrightarrow underset unicode unlhd unrhd uparrow updownarrow
upharpoonleft upharpoonright uplus uproot upsilon upuparrows urcorner vDash varDelta varGamma
varLambda varOmega varPhi varPi varPsi varSigma varTheta varUpsilon varXi varepsilon varinjlim
varkappa varliminf varlimsup varnothing varphi varpi varprojlim varpropto varrho varsigma
varsubsetneq varsubsetneqq varsupsetneq varsupsetneqq vartheta vartriangle vartriangleleft
vartriangleright vcenter vdash vdots vec vee veebar verb vert vphantom wedge widehat widetilde
wp wr xcancel xi xleftarrow xlongequal xmapsto xrightarrow xtofrom xtwoheadleftarrow
xtwoheadrightarrow yen zeta
""".split())

MATHJAX_LIST_JS = r"""
const {TeX} = require('mathjax-full/js/input/tex.js');
for (const p of ['base/BaseConfiguration', 'ams/AmsConfiguration', 'newcommand/NewcommandConfiguration',
                 'noundefined/NoUndefinedConfiguration', 'require/RequireConfiguration',
                 'autoload/AutoloadConfiguration', 'configmacros/ConfigMacrosConfiguration']) {
  require('mathjax-full/js/input/tex/' + p + '.js');
}
const {liteAdaptor} = require('mathjax-full/js/adaptors/liteAdaptor.js');
const {RegisterHTMLHandler} = require('mathjax-full/js/handlers/html.js');
const {mathjax} = require('mathjax-full/js/mathjax.js');
RegisterHTMLHandler(liteAdaptor());
const tex = new TeX({packages: ['base', 'ams', 'newcommand', 'noundefined', 'require', 'autoload', 'configmacros']});
mathjax.document('', {InputJax: tex});
const names = new Set();
for (const kind of ['macro', 'character', 'delimiter']) {
  for (const entry of tex.parseOptions.handlers.get(kind)._configuration) {
    if (entry.item && entry.item.map) { for (const k of entry.item.map.keys()) { names.add(k.replace(/^\\\\/, '')); } }
  }
}
console.log([...names].filter(n => /^[A-Za-z]+$/.test(n)).sort().join(' '));
"""

_TOKEN = re.compile(r"\\([A-Za-z]+|.)", re.S)
_DEFINES = re.compile(r"\\(?:re)?newcommand\*?\s*\{?\s*\\([A-Za-z]+)|\\def\s*\\([A-Za-z]+)|"
                      r"\\DeclareMathOperator\*?\s*\{\s*\\([A-Za-z]+)")


def page_math(page_html: str) -> list[str]:
    """The TeX of every math element of a built page, in page order (what MathJax typesets:
    ``span.math`` and ``div.math``, the only classes ``mathjax3_config`` lets it process)."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(page_html, "html.parser")
    return [el.get_text() for el in soup.select("span.math, div.math")]


def config_macros(page_html: str) -> set[str]:
    """The macros the page's MathJax configuration defines (``_config.yml``: mathjax3_config)."""
    m = re.search(r"window\.MathJax\s*=\s*(\{.*?\})\s*</script>", page_html, re.S)
    if not m:
        return set()
    return set(json.loads(m.group(1)).get("tex", {}).get("macros", {}))


def undefined_macros(page_html: str, builtins=MATHJAX_MACROS) -> list[tuple[str, str]]:
    """``(macro, TeX)`` for each use of a macro that is neither a MathJax built-in, nor in the
    page's MathJax configuration, nor defined by a ``\\newcommand`` earlier on the page (or in
    the same formula)."""
    known = set(builtins) | config_macros(page_html)
    found = []
    for tex in page_math(page_html):
        known |= {next(g for g in m.groups() if g) for m in _DEFINES.finditer(tex)}
        for m in _TOKEN.finditer(tex):
            name = m.group(1)
            if name.isalpha() and name not in known:
                found.append((name, tex.strip()[:80]))
    return found


def wide_code_lines(page_html: str, chars: int = CODE_CHARS[1366]) -> list[str]:
    """The source lines of the visible code cells of a built page (not collapsed in a
    ``<details>``, as a ``hide-input`` cell is) that are longer than ``chars``: they scroll sideways."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(page_html, "html.parser")
    lines = []
    for pre in soup.select("div.cell_input pre"):
        if pre.find_parent("details") is not None:
            continue
        lines += [ln for ln in pre.get_text().split("\n") if len(ln.expandtabs()) > chars]
    return lines


def inline_heights(page_html: str) -> list[str]:
    """The ``src`` of every ``<img>`` given a fixed height (a ``height`` attribute or an inline
    ``height:`` style): such an image cannot keep its aspect ratio when the column narrows."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(page_html, "html.parser")
    return [img.get("src", "")[-60:] for img in soup.find_all("img")
            if img.has_attr("height") or re.search(r"(?<![-\w])height\s*:", img.get("style", ""))]


def css_forced_heights(css: str) -> list[str]:
    """Rules of a stylesheet that give images a height other than ``auto`` (``height``,
    ``min-height``; ``max-height`` only limits)."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    bad = []
    for selector, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
        if re.search(r"\bimg\b", selector):
            for prop, value in re.findall(r"(?<![-\w])((?:min-)?height)\s*:\s*([^;]+)", body):
                if value.strip() != "auto":
                    bad.append(f"{selector.strip()} {{ {prop}: {value.strip()} }}")
    return bad


# ----------------------------------------------------------------------------- browser measurement
MEASURE_JS = r"""
(function () {
  function hidden(inner, outer) { return inner > outer + 1 ? 1 - outer / inner : 0; }
  function where(el) {
    var s = el.closest('section'); var h = s ? s.querySelector('h1,h2,h3,h4,h5,h6') : null;
    return h ? h.textContent.replace('#', '').trim().slice(0, 60) : '';
  }
  function first(el) { return (el.textContent.trim().split('\n')[0] || '').slice(0, 70); }
  /* viewport: the layout viewport's width (on a phone window.innerWidth grows with a page wider
     than the screen, so it cannot tell whether the page scrolls sideways) */
  var out = {width: window.innerWidth, height: window.innerHeight, page_width: document.documentElement.scrollWidth,
             viewport: document.documentElement.clientWidth,
             mathjax: !!(window.MathJax && window.MathJax.startup && document.querySelector('mjx-container')),
             outputs: [], tables: [], math: [], images: [], players: [], widgets: []};
  var article = document.querySelector('article.bd-article') || document.querySelector('article') || document.body;
  var col = article.getBoundingClientRect().width;
  out.column = Math.round(col);
  document.querySelectorAll('div.cell_output pre').forEach(function (el) {
    out.outputs.push({hidden: hidden(el.scrollWidth, el.clientWidth), px: el.scrollWidth, box: el.clientWidth,
                      collapsed: !!el.closest('details'), section: where(el), first: first(el)});
  });
  article.querySelectorAll('table').forEach(function (el) {
    var box = Math.min(el.parentElement.getBoundingClientRect().width, col);
    var cells = Array.prototype.map.call(el.querySelectorAll('td,th'), function (c) { return c.getBoundingClientRect().width; });
    out.tables.push({hidden: hidden(el.scrollWidth, box), px: el.scrollWidth, box: Math.round(box),
                     narrowest_cell: cells.length ? Math.round(Math.min.apply(null, cells)) : null,
                     in_output: !!el.closest('div.cell_output'), section: where(el), first: first(el)});
  });
  document.querySelectorAll('div.math').forEach(function (el) {
    var m = el.querySelector('mjx-container mjx-math') || el.querySelector('mjx-container');
    if (!m) { return; }
    var c = m.closest('mjx-container') || el, mr = m.getBoundingClientRect();
    var cr = c.getBoundingClientRect(), br = el.getBoundingClientRect();
    var left = Math.max(mr.left, cr.left, br.left, 0), right = Math.min(mr.right, cr.right, br.right, window.innerWidth);
    var eq = el.querySelector('.eqno'), er = eq ? eq.getBoundingClientRect() : null;
    var over = er ? (er.left < right - 1 && er.right > left + 1 && er.top < mr.bottom && er.bottom > mr.top) : false;
    out.math.push({id: el.id || '', label: eq ? eq.textContent.replace('#', '').trim() : '',
                   hidden: hidden(mr.width, right - left - (over ? Math.min(er.width, right - er.left) : 0)),
                   px: Math.round(mr.width), box: Math.round(right - left),
                   scrolls: c.scrollWidth > c.clientWidth + 1 && ['auto', 'scroll'].indexOf(getComputedStyle(c).overflowX) >= 0,
                   number_over_math: over, section: where(el)});
  });
  article.querySelectorAll('img').forEach(function (el) {
    if (!el.naturalWidth || el.closest('.animation')) { return; }
    var r = el.getBoundingClientRect();
    out.images.push({src: (el.getAttribute('src') || '').slice(-40), natural: el.naturalWidth, shown: Math.round(r.width),
                     scale: r.width / el.naturalWidth, in_widget: !!el.closest('.jupyter-widgets'), section: where(el),
                     /* shown aspect ratio over the PNG's own: 1 when the figure keeps its shape */
                     distortion: r.width && el.naturalHeight ? (r.height / r.width) / (el.naturalHeight / el.naturalWidth) : 1,
                     inline_height: !!el.style.height || el.hasAttribute('height')});
  });
  /* code cells: how much of a source line the cell's box hides (it scrolls sideways) */
  out.code = [];
  article.querySelectorAll('div.cell_input pre').forEach(function (el) {
    out.code.push({hidden: hidden(el.scrollWidth, el.clientWidth), px: el.scrollWidth, box: el.clientWidth,
                   collapsed: !!el.closest('details'), section: where(el), first: first(el)});
  });
  /* TeX that MathJax could not typeset: an undefined macro shows as red text (noundefined) or an error */
  out.undefined_tex = [];
  article.querySelectorAll('mjx-merror, mjx-mtext[style*="color: red"]').forEach(function (el) {
    var text = Array.prototype.map.call(el.querySelectorAll('mjx-c'), function (c) {
      var m = /mjx-c([0-9A-F]+)/.exec(c.className); return m ? String.fromCodePoint(parseInt(m[1], 16)) : '';
    }).join('');
    out.undefined_tex.push({text: (text || el.textContent).slice(0, 40), section: where(el)});
  });
  article.querySelectorAll('.animation').forEach(function (el) {
    var img = el.querySelector('img');
    out.players.push({px: el.scrollWidth, hidden: hidden(Math.max(el.scrollWidth, el.getBoundingClientRect().width), col),
                      img_natural: img ? img.naturalWidth : null, img_shown: img ? Math.round(img.getBoundingClientRect().width) : null,
                      section: where(el)});
  });
  article.querySelectorAll('.widget-vbox, .widget-hbox').forEach(function (el) {
    if (el.parentElement.closest('.widget-vbox, .widget-hbox')) { return; }
    var r = el.getBoundingClientRect(), img = el.querySelector('img');
    var sliders = Array.prototype.map.call(el.querySelectorAll('.widget-slider .slider-container, .widget-slider .noUi-target'),
                                           function (s) { return Math.round(s.getBoundingClientRect().width); });
    var ir = img ? img.getBoundingClientRect() : null;
    out.widgets.push({width: Math.round(r.width), height: Math.round(r.height), hidden: hidden(el.scrollWidth, col),
                      img_natural: img ? img.naturalWidth : null, img_shown: ir ? Math.round(ir.width) : null,
                      img_top: ir ? Math.round(ir.top - r.top) : null, img_height: ir ? Math.round(ir.height) : null,
                      narrowest_slider: sliders.length ? Math.min.apply(null, sliders) : null,
                      text: (el.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 90), section: where(el)});
  });
  return out;
})()
"""

#: the characters of the theme's monospace that fit on one line of the first ``pre`` under a selector
_CHARS_JS = r"""
(function () {
  var pre = document.querySelector('SELECTOR');
  if (!pre) { return null; }
  var probe = document.createElement('span'); probe.textContent = 'x'.repeat(200);
  var saved = pre.innerHTML; pre.innerHTML = ''; pre.appendChild(probe);
  var ch = probe.getBoundingClientRect().width / 200, cs = getComputedStyle(pre);
  var inner = pre.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
  pre.innerHTML = saved;
  return {char_px: ch, inner_px: inner, chars: Math.floor(inner / ch + 1e-6)};
})()
"""
CODE_JS = _CHARS_JS.replace("SELECTOR", "div.cell_input pre")      # a code cell's source
COLUMN_JS = _CHARS_JS.replace("SELECTOR", "div.cell_output pre")   # a cell's text output


def chromium() -> str | None:
    """The path of a Chromium (or Chrome) executable, or ``None``."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _rewrite(text: str) -> str:
    for url, local in CDN_ASSETS.items():
        text = text.replace(url, "/_local/" + local)
    return re.sub(r'\s+integrity="[^"]*"', "", text)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextlib.contextmanager
def served(html_dir: Path = HTML, assets: Path | None = None):
    """Serve the built site on 127.0.0.1 and yield its base URL. With ``assets``, a copy is served
    whose pages load MathJax and the widget manager from that folder instead of their CDNs."""
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(html_dir)
        if assets is not None:
            site = Path(tmp) / "site"
            shutil.copytree(html_dir, site)
            local = site / "_local"
            local.mkdir()
            for name in ("mathjax", "html-manager", "requirejs"):
                if not (Path(assets) / name).is_dir():
                    raise FileNotFoundError(f"{Path(assets) / name} is missing (see this script's docstring)")
                (local / name).symlink_to((Path(assets) / name).resolve())
            (local / "npm").symlink_to(Path(assets).resolve())
            for page in site.rglob("*.html"):
                text = page.read_text(encoding="utf-8")
                new = _rewrite(text)
                if new != text:
                    page.write_text(new, encoding="utf-8")
        handler = functools.partial(_Quiet, directory=str(site))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
            server.server_close()


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
    JSON messages ended by a NUL byte, on file descriptors 3 and 4), so no driver package is needed.
    One tab: :meth:`open` sets the viewport (device metrics, so a 390 px phone is 390 px wide) and
    loads a page, :meth:`evaluate` runs JavaScript, :meth:`screenshot` saves a PNG."""

    def __init__(self, executable: str | None = None):
        exe = executable or chromium()
        if exe is None:
            raise RuntimeError("Chromium is not installed (Debian: apt-get install -y chromium)")
        self._profile = tempfile.TemporaryDirectory()
        r3, w3 = os.pipe()
        r4, w4 = os.pipe()

        def fds():
            os.dup2(r3, 3)
            os.dup2(w4, 4)

        self._proc = subprocess.Popen(
            [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
             "--disable-extensions", "--remote-debugging-pipe", f"--user-data-dir={self._profile.name}",
             "about:blank"], pass_fds=(3, 4), preexec_fn=fds, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(r3)
        os.close(w4)
        self._out, self._in = os.fdopen(w3, "wb", buffering=0), os.fdopen(r4, "rb", buffering=0)
        self._buf, self._id, self._events = b"", 0, []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Page.enable", session=True)

    def _recv(self) -> dict:
        while b"\0" not in self._buf:
            chunk = self._in.read(1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        m = json.loads(msg)
        if "method" in m:
            self._events.append(m["method"])
        return m

    def call(self, method: str, params: dict | None = None, session: bool = False) -> dict:
        """Send one DevTools command and return its result."""
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self._session
        self._out.write(json.dumps(msg).encode() + b"\0")
        while True:
            m = self._recv()
            if m.get("id") == self._id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})

    def open(self, url: str, width: int, height: int = 768, settle_ms: int = 2500, timeout: float = 90) -> None:
        """Load ``url`` in a ``width`` x ``height`` viewport (a phone's, with touch, below 600 px) and
        wait for the load event, MathJax's first typesetting and ``settle_ms`` more."""
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": width < 600}, session=True)
        self._events.clear()
        self.call("Page.navigate", {"url": url}, session=True)
        t0 = time.monotonic()
        while "Page.loadEventFired" not in self._events:
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{url} did not load in {timeout} s")
            self._recv()
        self.evaluate("new Promise(function (done) { var p = window.MathJax && MathJax.startup && MathJax.startup.promise;"
                      f" (p || Promise.resolve()).then(function () {{ setTimeout(done, {settle_ms}); }}); }})")

    def evaluate(self, expression: str):
        """Evaluate JavaScript in the page (awaiting a promise) and return its value as JSON data."""
        r = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True},
                      session=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"JavaScript error: {r['exceptionDetails']}")
        return r["result"].get("value")

    def screenshot(self, out: Path, scroll_to: str | None = None, index: int = 0, margin: int = 70) -> Path:
        """A PNG of the viewport, scrolled first to the ``index``-th element matching the CSS selector
        ``scroll_to`` (placed ``margin`` px below the top, under the theme's header)."""
        if scroll_to:
            self.evaluate(f"(function () {{ var el = document.querySelectorAll({json.dumps(scroll_to)})[{index}];"
                          f" if (el) {{ el.scrollIntoView({{block: 'start'}}); window.scrollBy(0, -{margin}); }}"
                          " return new Promise(function (d) { setTimeout(d, 400); }); })()")
        data = self.call("Page.captureScreenshot", {"format": "png"}, session=True)["data"]
        Path(out).write_bytes(base64.b64decode(data))
        return Path(out)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call("Browser.close")
        with contextlib.suppress(Exception):
            self._proc.wait(timeout=10)
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._profile.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def browser_measure(pages: list[str], widths, assets: Path | None = None, html_dir: Path = HTML,
                    height: int = 768) -> dict:
    """``{page: {width: measurements}}`` of the built ``pages`` (paths relative to ``html_dir``)."""
    out = {}
    with served(html_dir, assets) as base, Browser() as browser:
        for page in pages:
            out[page] = {}
            for w in widths:
                browser.open(f"{base}/{page}", w, height)
                out[page][w] = browser.evaluate(MEASURE_JS)
    return out


def column_chars(widths, html_dir: Path = HTML, page: str = "book/ch01_associative_memory.html",
                 script: str = COLUMN_JS) -> dict:
    """``{width: characters of a text output that fit on one line}`` measured in Chromium (with
    ``script=CODE_JS``, of a code cell's source line)."""
    out = {}
    with served(html_dir) as base, Browser() as browser:
        for w in widths:
            browser.open(f"{base}/{page}", w, settle_ms=200)
            out[w] = browser.evaluate(script)
    return out


def summarize(measured: dict) -> list[str]:
    """One line per page and width: outputs, tables and equations cut; stretched images."""
    lines = []
    for page, by_width in measured.items():
        for w, m in by_width.items():
            cut = [o for o in m["outputs"] if o["hidden"] > 0]
            tcut = [t for t in m["tables"] if t["hidden"] > 0]
            mcut = [e for e in m["math"] if e["hidden"] > 0]
            over = [e for e in m["math"] if e["number_over_math"]]
            stretched = [i for i in m["images"] if i["scale"] > 1.05]
            squashed = [i for i in m["images"] if abs(i.get("distortion", 1) - 1) > 0.02]
            pcut = [p for p in m["players"] if p["hidden"] > 0]
            ccut = [c for c in m.get("code", []) if c["hidden"] > 0 and not c.get("collapsed")]
            hcut = [c for c in m.get("code", []) if c["hidden"] > 0 and c.get("collapsed")]
            lines.append(f"{page} @{w}px (column {m['column']} px, page {m['page_width']} px"
                         + (", PAGE SCROLLS SIDEWAYS" if m["page_width"] > m.get("viewport", m["width"]) + 1 else "")
                         + "): "
                         f"outputs cut {len(cut)}/{len(m['outputs'])} (max {max([o['hidden'] for o in cut], default=0):.0%}),"
                         f" tables cut {len(tcut)}/{len(m['tables'])}, equations cut {len(mcut)}/{len(m['math'])}"
                         f" (max {max([e['hidden'] for e in mcut], default=0):.0%})"
                         + ("" if m["mathjax"] else " (no MathJax: not measured)") +
                         f", numbers over math {len(over)}, images stretched {len(stretched)}/{len(m['images'])},"
                         f" distorted {len(squashed)} (max x{max([max(i['distortion'], 1 / i['distortion']) for i in squashed], default=1):.2f}),"
                         f" code cells cut {len(ccut)}/{len(m.get('code', []))} (and {len(hcut)} collapsed),"
                         f" undefined TeX {len(m.get('undefined_tex', []))},"
                         f" players cut {len(pcut)}/{len(m['players'])}, widgets {len(m['widgets'])}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("static", help="text outputs wider than the column (no browser)")
    s.add_argument("--html", type=Path, default=HTML)
    c = sub.add_parser("column", help="measure COLUMN_CHARS in Chromium")
    c.add_argument("--html", type=Path, default=HTML)
    b = sub.add_parser("browser", help="measure pages in headless Chromium")
    b.add_argument("pages", nargs="*", help="pages relative to the built site (default: book/*.html)")
    b.add_argument("--width", type=int, action="append")
    b.add_argument("--height", type=int, default=768)
    b.add_argument("--assets", type=Path)
    b.add_argument("--html", type=Path, default=HTML)
    b.add_argument("--json", type=Path, help="write every measurement to this file")
    sh = sub.add_parser("shot", help="a screenshot of one page")
    sh.add_argument("page")
    sh.add_argument("--out", type=Path, required=True)
    sh.add_argument("--width", type=int, default=1366)
    sh.add_argument("--height", type=int, default=768)
    sh.add_argument("--scroll-to")
    sh.add_argument("--index", type=int, default=0)
    sh.add_argument("--assets", type=Path)
    sh.add_argument("--html", type=Path, default=HTML)
    args = ap.parse_args(argv)
    if args.cmd == "static":
        print_static(static_overflow(args.html))
    elif args.cmd == "column":
        for w, r in column_chars(sorted(COLUMN_CHARS, reverse=True), args.html).items():
            print(f"{w} px, text output: {r}")
        for w, r in column_chars(sorted(CODE_CHARS, reverse=True), args.html, script=CODE_JS).items():
            print(f"{w} px, code cell: {r}")
    elif args.cmd == "browser":
        pages = args.pages or [p.relative_to(args.html).as_posix() for p in chapter_pages(args.html)]
        measured = browser_measure(pages, args.width or [1366, 390], args.assets, args.html, args.height)
        if args.json:
            args.json.write_text(json.dumps(measured, indent=1))
        print("\n".join(summarize(measured)))
    else:
        with served(args.html, args.assets) as base, Browser() as browser:
            browser.open(f"{base}/{args.page}", args.width, args.height)
            browser.screenshot(args.out, args.scroll_to, args.index)
        print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
