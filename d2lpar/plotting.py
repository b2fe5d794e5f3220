"""Plotting: an Animator that redraws one PNG in place while training runs."""

import io

__all__ = ['Animator', 'in_notebook']


def in_notebook():
    """Return True inside a Jupyter kernel (JupyterLab, nbval), else False."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, 'kernel')


def _plain(value):
    """Return tensors and arrays as Python numbers or lists (a 0-d tensor has no len())."""
    return value.tolist() if hasattr(value, 'tolist') else value


def _limits(value, name):
    """Return `value` if it is None or a pair (low, high) of numbers or Nones, else raise."""
    if value is None:
        return None
    value = _plain(value)
    if (
        isinstance(value, (str, bytes))
        or not hasattr(value, '__len__')
        or len(value) != 2
        or any(v is not None and (isinstance(v, bool) or not isinstance(_plain(v), (int, float))) for v in value)
    ):
        raise ValueError(
            f'Animator: {name} must be None or a pair [low, high] of numbers (None leaves that end free), got {value!r}'
        )
    return [_plain(v) for v in value]


class Animator:
    """Draw one or more curves that grow point by point while a loop runs.

    In a notebook the figure is a single PNG output, replaced at every `add`,
    so the plot updates in place instead of piling up copies. Outside a
    notebook each new point is printed as a line of text, which keeps scripts
    and their logs readable. The Animator draws one plot: `nrows` and `ncols`
    exist for d2l's signature and must stay 1.
    """

    def __init__(
        self,
        xlabel=None,
        ylabel=None,
        legend=None,
        xlim=None,
        ylim=None,
        xscale='linear',
        yscale='linear',
        fmts=('-', 'm--', 'g-.', 'r:'),
        nrows=1,
        ncols=1,
        figsize=(3.5, 2.5),
        title=None,
    ):
        for name, value in (('nrows', nrows), ('ncols', ncols)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f'Animator: {name} must be a positive int, got {value!r}')
        if (nrows, ncols) != (1, 1):  # d2l also draws only into the first subplot: say so
            raise ValueError(
                f'Animator draws one plot, got nrows={nrows}, ncols={ncols}; make one '
                'Animator per plot (several lines go into one plot through legend=)'
            )
        xlim, ylim = _limits(xlim, 'xlim'), _limits(ylim, 'ylim')
        # A bare Figure avoids pyplot's global state and its auto-display.
        from matplotlib.figure import Figure

        self.fig = Figure(figsize=figsize)
        # As in d2l: a list of every subplot, and the lines are drawn in axes[0].
        self.axes = list(self.fig.subplots(nrows, ncols, squeeze=False).flat)
        if isinstance(legend, str):  # one line's name, not a list of one-letter names
            legend = [legend]
        self.xlabel, self.ylabel, self.legend = xlabel, ylabel, list(legend or [])
        self.xlim, self.ylim, self.xscale, self.yscale = xlim, ylim, xscale, yscale
        self.fmts, self.title = fmts, title
        self.X, self.Y = None, None
        self._handle = None

    def add(self, x, y):
        """Append a point to every curve: x and y are numbers or lists of one per curve."""
        x, y = _plain(x), _plain(y)
        if not isinstance(y, (list, tuple)):
            y = [y]
        n = len(y)
        if n == 0:
            raise ValueError('Animator.add: y is empty; pass one value per line')
        if not isinstance(x, (list, tuple)):
            x = [x] * n
        for name, values, missing in (('x', x, ''), ('y', y, ' or None (no point)')):
            odd = [
                v
                for v in values
                if (v is not None or not missing) and (isinstance(v, bool) or not isinstance(_plain(v), (int, float)))
            ]
            if odd:
                raise TypeError(f'Animator.add: {name} must be numbers (one per line){missing}, got {odd[0]!r}')
        x, y = [_plain(v) for v in x], [_plain(v) for v in y]
        if len(x) != n:
            raise ValueError(f'Animator.add: got {len(x)} x values for {n} y values')
        if self.X is None:
            if n > len(self.fmts):
                raise ValueError(
                    f'Animator.add: {n} lines but only {len(self.fmts)} formats '
                    f'in fmts={self.fmts!r}; pass one format per line'
                )
            self.X, self.Y = [[] for _ in range(n)], [[] for _ in range(n)]
        if n != len(self.Y):
            raise ValueError(f'Animator.add: this plot has {len(self.Y)} lines, got {n} values')
        for xs, ys, a, b in zip(self.X, self.Y, x, y):
            if None not in (a, b):  # None leaves this curve without a point this time
                xs.append(a)
                ys.append(b)
        self._redraw()
        if in_notebook():
            self._show()
        else:
            names = self.legend or [self.ylabel or 'y'] * n
            points = ', '.join(f'{name} {v:.4g}' for name, v in zip(names, y) if v is not None)
            print(f'{self.xlabel or "x"} {x[0]:g}: {points}')

    def _redraw(self):
        ax = self.axes[0]
        ax.clear()
        for fmt, xs, ys in zip(self.fmts, self.X, self.Y):
            ax.plot(xs, ys, fmt)
        ax.set(xlabel=self.xlabel, ylabel=self.ylabel, xscale=self.xscale, yscale=self.yscale)
        limits = {'xlim': self.xlim, 'ylim': self.ylim, 'title': self.title}
        ax.set(**{name: value for name, value in limits.items() if value})
        if self.legend:
            ax.legend(self.legend)
        ax.grid(True)
        self.fig.tight_layout()

    def png(self):
        """Return the current figure as PNG bytes."""
        buf = io.BytesIO()
        self.fig.savefig(buf, format='png', dpi=100)
        return buf.getvalue()

    def _show(self):
        from IPython.display import Image, display

        image = Image(data=self.png(), format='png')
        if self._handle is None:
            self._handle = display(image, display_id=True)
        else:
            self._handle.update(image)
