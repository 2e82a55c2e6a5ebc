//! The sans-IO VSR replica core (in progress).
