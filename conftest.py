"""Test-suite settings shared by the unit tests and the notebooks run by nbval.

Kernels started by nbval inherit this environment: notebooks then use the
offline Fashion-MNIST stand-in and their small workload (see README).
"""
import os

os.environ['D2LPAR_OFFLINE'] = '1'
os.environ['D2LPAR_SMALL'] = '1'
os.environ.setdefault('MPLBACKEND', 'Agg')
