//! ivory-cel
