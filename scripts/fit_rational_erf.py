#!/usr/bin/env python3
"""Fits the rational erf approximation of src/ops/rational_erf.cpp.

erf(x) ~= x * P(u) / Q(u), u = x^2, Q(0) = 1, by iteratively reweighted linear
least squares on x in (0, 4]; prints the float32 coefficients and the max abs
error of a float32 evaluation over [-5, 5] for three degree choices. Run with
the project venv: .venv/bin/python scripts/fit_rational_erf.py
"""
import numpy as np
from math import erf
verf=np.vectorize(erf)
# Fit erf(x) ~= x * P(u) / Q(u), u = x^2, on [0, 4], Q(0) = 1.
x=np.linspace(0,4,20001)[1:]
f=verf(x)
u=x*x
def fit(np_,nq,iters=8):
    w=np.ones_like(x)
    for _ in range(iters):
        # unknowns: p0..p_np, q1..q_nq ; x*P(u) - f*(1+sum q_j u^j) = 0
        A=np.concatenate([np.stack([x*u**i for i in range(np_+1)],1), np.stack([-f*u**j for j in range(1,nq+1)],1)],1)
        b=f
        # relative weighting by previous Q and error scaling
        sol,*_=np.linalg.lstsq(A*w[:,None], b*w, rcond=None)
        p=sol[:np_+1]; q=np.concatenate([[1.0],sol[np_+1:]])
        Q=np.polyval(q[::-1],u)
        w=1/np.abs(Q)
    return p,q
for np_,nq in [(4,4),(5,5),(6,6)]:
    p,q=fit(np_,nq)
    xf=np.linspace(-5,5,400001).astype(np.float32)
    xc=np.clip(xf,-4,4); uf=xc*xc
    P=np.zeros_like(uf); 
    for c in p[::-1].astype(np.float32): P=P*uf+c
    Q=np.zeros_like(uf)
    for c in q[::-1].astype(np.float32): Q=Q*uf+c
    approx=xc*P/Q
    err=np.max(np.abs(approx.astype(np.float64)-verf(xf.astype(np.float64))))
    print(np_,nq,err, "minQ", Q.min())
    print(repr(p.astype(np.float32)), repr(q.astype(np.float32)))
